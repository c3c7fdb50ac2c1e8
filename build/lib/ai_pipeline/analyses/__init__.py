"""The analyses that come with the product, as plain declarations a team may copy.

- ``document_analysis``: keywords, summary, sentiment and entities of any document (the demo's);
- ``contract_review``: each numbered clause's risk and suggested change, and a report.

Each is written against ``ai_pipeline.declaration``'s public API only.
"""

from pydantic import ImportString, TypeAdapter, ValidationError

from ai_pipeline.analyses.contract_review import CONTRACT_REVIEW
from ai_pipeline.analyses.document_analysis import DOCUMENT_ANALYSIS
from ai_pipeline.declaration import Declaration, DeclarationError

BUILTINS: dict[str, Declaration] = {d.name: d for d in (DOCUMENT_ANALYSIS, CONTRACT_REVIEW)}
# The analysis of a deployment that names none.
DEFAULT = DOCUMENT_ANALYSIS
_IMPORT = TypeAdapter(ImportString)
# Declarations made where the code location loads (a component's defs.yaml), by name.
_REGISTERED: dict[str, Declaration] = {}


def register(declaration: Declaration) -> None:
    """Make a declaration known by its name in this process (a component does, as it loads), so
    that settings and commands can name it like a built-in. The newest one of a name wins: a
    reloaded code location replaces its own."""
    builtin = BUILTINS.get(declaration.name)
    if builtin is not None and builtin != declaration:
        raise DeclarationError(
            f"analysis {declaration.name!r}: the name of a built-in analysis; choose another"
        )
    _REGISTERED[declaration.name] = declaration


def resolve(name_or_path: str) -> Declaration:
    """A built-in or registered analysis by name, or a ``Declaration`` by import path
    (``pkg.mod:NAME``)."""
    if name_or_path in BUILTINS:
        return BUILTINS[name_or_path]
    if name_or_path in _REGISTERED:
        return _REGISTERED[name_or_path]
    if "." not in name_or_path and ":" not in name_or_path:
        raise DeclarationError(
            f"no analysis {name_or_path!r}: the built-ins are {', '.join(BUILTINS)}, or give the "
            "import path of a Declaration (package.module:NAME)"
        )
    try:
        found = _IMPORT.validate_python(name_or_path)
    except ValidationError as e:
        raise DeclarationError(f"analysis {name_or_path!r}: {e.errors()[0]['msg']}") from None
    if not isinstance(found, Declaration):
        raise DeclarationError(f"{name_or_path} is a {type(found).__name__}, not a Declaration")
    return found


__all__ = ["BUILTINS", "CONTRACT_REVIEW", "DEFAULT", "DOCUMENT_ANALYSIS", "register", "resolve"]
