"""Named, versioned prompts.

A prompt's version is part of every task id built from it, so changing the wording without
bumping the version would silently reuse checkpoints made with the old wording. Bump the version
with every change of text: exactly the documents analysed under the old version run again.

The document is sent between the markers ``<<<DOCUMENT`` and ``DOCUMENT>>>`` so that any
OpenAI-compatible server (the bundled simulator included) can tell the instructions from the text.
"""

from __future__ import annotations

from dataclasses import dataclass

DOCUMENT_START = "<<<DOCUMENT"
DOCUMENT_END = "DOCUMENT>>>"


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    system: str
    user_template: str

    def messages(self, text: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user_template.format(text=text)},
        ]


ANALYSIS = Prompt(
    name="document_analysis",
    version="v1",
    system=(
        "You analyse one document and answer with a single JSON object and nothing else. "
        "The object has exactly these fields: "
        '"keywords": 1 to 3 short strings that name what the document is about; '
        '"summary": at most 200 characters, in the language of the document; '
        '"sentiment": one of "positive", "neutral", "negative"; '
        '"entities": names of people, organisations and places exactly as written in the '
        "document (an empty list when there are none); "
        '"confidence": a number from 0 to 1 saying how sure you are of this analysis. '
        "Never invent an entity that does not occur in the document."
    ),
    user_template=f"{DOCUMENT_START}\n{{text}}\n{DOCUMENT_END}",
)


def current_analysis() -> Prompt:
    """The analysis prompt in use, read when asked (a process that changes it, as a release or
    a test does, changes every task id built after)."""
    return ANALYSIS
