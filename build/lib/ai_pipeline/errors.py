"""The error a caller can fix: bad input, an unknown id, a request that does not fit the state.

Raised by the application layer with a message meant for the person who asked; the CLI prints it
as one line and exits 2, a service would answer it with a 4xx. Failures of a document's work are
not this: they are categories (``ai_pipeline.failures``), recorded on the document.
"""


class InputError(Exception):
    """A request that cannot be carried out as asked; the message says why and what to do."""
