"""Tenants and their API keys, from the tenants file (``AI_PIPELINE_TENANTS_FILE``).

YAML or JSON (JSON is YAML)::

    tenants:
      acme:
        keys: [acme-key-1, acme-key-2]
        requests_per_minute: 120        # optional: the tenant's requests (all its keys) per
                                        # clock minute, counted in the results database
      globex:
        keys: [globex-key]
    operators:                          # who may open the review queue page
      keys: [operator-key]

A key belongs to one tenant (or is an operator key); a file where two tenants share a key, a
tenant has no key, or a key is empty is refused with a message that names the place — never the
key itself, which is a secret.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ai_pipeline.errors import InputError

TENANT_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class TenantsFileError(InputError, ValueError):
    """The tenants file cannot be used; the message names the file and the place."""


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    requests_per_minute: int | None = None


@dataclass
class Tenants:
    """Who a bearer key is: a tenant, an operator, or nobody."""

    by_key: dict[str, Tenant]
    operator_keys: frozenset[str] = frozenset()

    def tenant_of(self, key: str) -> Tenant | None:
        # Compare every key in constant time: which prefix matched must not leak through timing.
        found = None
        for known, tenant in self.by_key.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        return found

    def is_operator(self, key: str) -> bool:
        return any(hmac.compare_digest(k.encode(), key.encode()) for k in self.operator_keys)


def load_tenants(path: str | Path) -> Tenants:
    """Read and check the tenants file."""
    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as e:
        raise TenantsFileError(f"tenants file {source}: cannot read it: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise TenantsFileError(f"tenants file {source}: not YAML or JSON: {e}") from e
    return parse_tenants(data, str(source))


def parse_tenants(data: Any, source: str = "tenants file") -> Tenants:
    def fail(where: str, why: str) -> TenantsFileError:
        return TenantsFileError(f"{source}: {where}: {why}")

    if not isinstance(data, dict) or not isinstance(data.get("tenants"), dict):
        raise fail("top level", "needs a `tenants` mapping of tenant id to its keys")
    by_key: dict[str, Tenant] = {}
    for tenant_id, entry in data["tenants"].items():
        where = f"tenants.{tenant_id}"
        if not isinstance(tenant_id, str) or not tenant_id or set(tenant_id) - TENANT_ID_CHARS:
            raise fail(where, "a tenant id is letters, digits, '-', '_' or '.'")
        if not isinstance(entry, dict):
            raise fail(where, "needs `keys: [...]`")
        limit = entry.get("requests_per_minute")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise fail(f"{where}.requests_per_minute", "must be a whole number ≥ 1")
        tenant = Tenant(tenant_id, limit)
        for i, key in enumerate(_keys(entry, fail, where)):
            if key in by_key:
                raise fail(f"{where}.keys[{i}]", f"the key is also {by_key[key].tenant_id}'s")
            by_key[key] = tenant
    operators = data.get("operators") or {}
    if not isinstance(operators, dict):
        raise fail("operators", "needs `keys: [...]`")
    operator_keys = _keys(operators, fail, "operators") if operators else []
    for i, key in enumerate(operator_keys):
        if key in by_key:
            raise fail(f"operators.keys[{i}]", "an operator key may not be a tenant's key")
    return Tenants(by_key, frozenset(operator_keys))


def _keys(entry: dict[str, Any], fail: Any, where: str) -> list[str]:
    keys = entry.get("keys")
    if not isinstance(keys, list) or not keys:
        raise fail(f"{where}.keys", "needs at least one key")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key.strip():
            raise fail(f"{where}.keys[{i}]", "a key is a non-empty string")
    return [str(k) for k in keys]
