"""The code location a command or the service works with: the product's own
(``ai_pipeline.definitions``), or a project's that holds its analyses as components, named by
``AI_PIPELINE_DEFINITIONS`` (``package.module`` or ``package.module:attribute``, as ``dagster -m``
would load it). Loading it also makes its declared analyses known by name in this process.
"""

from __future__ import annotations

import functools
import importlib

import dagster as dg

from ai_pipeline.errors import InputError

OWN = "ai_pipeline.definitions:defs"


@functools.cache
def load_definitions(path: str = OWN) -> dg.Definitions:
    """The ``Definitions`` at ``path``: a ``Definitions`` object, or a function decorated with
    ``@dg.definitions`` (a ``dg`` project's ``definitions.py``), called."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(
            f"AI_PIPELINE_DEFINITIONS={path!r}: cannot import {module_name}: {e}"
        ) from None
    found = getattr(module, attribute or "defs", None)
    if callable(found) and not isinstance(found, dg.Definitions):
        found = found()
    if not isinstance(found, dg.Definitions):
        raise InputError(
            f"AI_PIPELINE_DEFINITIONS={path!r}: {module_name}.{attribute or 'defs'} is not a "
            "Definitions (nor a function decorated with @dg.definitions)"
        )
    return found
