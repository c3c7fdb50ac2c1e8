"""Keeping secrets out of logs, run tags, metadata and the failure-events table.

Every text that leaves the process about a failure goes through ``redact``: it removes the values
of registered secrets (the API keys in use, registered when they are read) and anything shaped like
a credential (``sk-…`` keys, ``Bearer …`` headers, passwords in URLs).
"""

from __future__ import annotations

import re
import threading

_secrets: set[str] = set()
_lock = threading.Lock()
MASK = "[REDACTED]"

_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    # "Authorization: Bearer X", "Bearer X", "api_key=X": the credential is the last word.
    re.compile(
        r"(?i)\b(bearer|api[-_ ]?key|authorization)([\s:=\"']+)(?:bearer\s+)?[A-Za-z0-9_\-\.=]{6,}"
    ),
    re.compile(r"(?<=://)([^:/@\s]+):([^@/\s]+)@"),
)


def register_secret(value: str | None) -> None:
    """Remember a secret value so that ``redact`` removes it wherever it shows up."""
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def redact(text: str) -> str:
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _PATTERNS[0].sub(MASK, text)
    text = _PATTERNS[1].sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _PATTERNS[2].sub(lambda m: f"{m.group(1)}:{MASK}@", text)
