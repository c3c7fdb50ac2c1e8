"""The tenants file: who a key is, refused shapes named by their place, never by the key; each
tenant's requests counted per minute in the results database."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from ai_pipeline.service.tenants import TenantsFileError, load_tenants, parse_tenants
from ai_pipeline.store import Store
from ai_pipeline.store.tables import tenant_requests

GOOD = {
    "tenants": {
        "acme": {"keys": ["a1", "a2"], "requests_per_minute": 2},
        "globex": {"keys": ["g1"]},
    },
    "operators": {"keys": ["op"]},
}


def test_keys_name_their_tenant_and_operators_apart() -> None:
    tenants = parse_tenants(GOOD)
    assert tenants.tenant_of("a1").tenant_id == "acme"  # type: ignore[union-attr]
    assert tenants.tenant_of("a2").tenant_id == "acme"  # type: ignore[union-attr]
    assert tenants.tenant_of("g1").tenant_id == "globex"  # type: ignore[union-attr]
    assert tenants.tenant_of("a") is None and tenants.tenant_of("") is None
    assert tenants.tenant_of("op") is None and tenants.is_operator("op")
    assert not tenants.is_operator("a1")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two Stores (two engines, as two web processes have) on one empty results database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    else:
        url = str(request.getfixturevalue("pg_test_database_url"))
    first, second = Store(url), Store(url)
    with first.db.engine.begin() as conn:
        conn.execute(tenant_requests.delete())
    yield first, second
    first.db.dispose()
    second.db.dispose()


def test_requests_are_counted_per_tenant_per_minute_across_stores(
    two_stores: tuple[Store, Store],
) -> None:
    """Every request gets its own number in its tenant's clock minute, whichever engine counts
    it and however many count at once; a new minute starts again at 1 and forgets the old."""
    first, second = two_stores
    t0 = datetime(2026, 12, 2, 6, 0, 5, tzinfo=timezone.utc)
    stores = [first, second] * 20
    with ThreadPoolExecutor(max_workers=8) as pool:
        numbers = list(pool.map(lambda s: s.tasks.count_request("acme", t0), stores))
    assert sorted(numbers) == list(range(1, 41))
    assert second.tasks.count_request("globex", t0) == 1
    assert first.tasks.count_request("acme", t0 + timedelta(seconds=54)) == 41
    assert second.tasks.count_request("acme", t0 + timedelta(seconds=55)) == 1
    rows = first.db.rows(sa.select(tenant_requests.c.tenant_id, tenant_requests.c.count))
    assert sorted((r.tenant_id, r.count) for r in rows) == [("acme", 1), ("globex", 1)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "top level: needs a `tenants` mapping"),
        ({"tenants": {"acme": {"keys": []}}}, "tenants.acme.keys: needs at least one key"),
        ({"tenants": {"acme": {"keys": ["  "]}}}, "tenants.acme.keys[0]: a key is a non-empty"),
        ({"tenants": {"a b": {"keys": ["k"]}}}, "tenants.a b: a tenant id is letters"),
        (
            {"tenants": {"acme": {"keys": ["k"]}, "globex": {"keys": ["k"]}}},
            "tenants.globex.keys[0]: the key is also acme's",
        ),
        (
            {"tenants": {"acme": {"keys": ["k"]}}, "operators": {"keys": ["k"]}},
            "operators.keys[0]: an operator key may not be a tenant's key",
        ),
        (
            {"tenants": {"acme": {"keys": ["k"], "requests_per_minute": 0}}},
            "tenants.acme.requests_per_minute: must be a whole number ≥ 1",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_place_not_the_key(data: dict, message: str) -> None:
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(data, "tenants.yaml")
    assert str(caught.value).startswith(f"tenants.yaml: {message}")
    assert "secret-key" not in str(caught.value)


def test_yaml_and_json_files(tmp_path: Path) -> None:
    yaml_file = tmp_path / "t.yaml"
    yaml_file.write_text("tenants:\n  acme:\n    keys: [k1]\n")
    json_file = tmp_path / "t.json"
    json_file.write_text('{"tenants": {"acme": {"keys": ["k2"]}}}')
    assert load_tenants(yaml_file).tenant_of("k1") is not None
    assert load_tenants(json_file).tenant_of("k2") is not None
    with pytest.raises(TenantsFileError, match="cannot read it"):
        load_tenants(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("tenants: [unclosed")
    with pytest.raises(TenantsFileError, match="not YAML or JSON"):
        load_tenants(broken)


def test_serve_refuses_to_start_without_a_usable_tenants_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ai_pipeline.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("AI_PIPELINE_TENANTS_FILE", raising=False)
    assert main(["serve"]) == 2
    assert "needs AI_PIPELINE_TENANTS_FILE" in capsys.readouterr().err
    bad = tmp_path / "tenants.yaml"
    bad.write_text("tenants:\n  acme:\n    keys: []\n")
    assert main(["serve", "--tenants-file", str(bad)]) == 2
    assert f"{bad}: tenants.acme.keys: needs at least one key" in capsys.readouterr().err
