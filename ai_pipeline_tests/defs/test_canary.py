"""The canary of a new analysis version: a sample of the stale documents analysed under the new
task ids, compared with their results, the stale backfill priced; the backfill then pays only
for the others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import dagster as dg
import pytest

from ai_pipeline.analyses.document_analysis import DocumentAnalysis
from ai_pipeline.cli import main
from ai_pipeline.reporting import current_task_suffix
from ai_pipeline.settings import Settings
from ai_pipeline_tests.support import (
    launcher,
    make_inbox,
    new_release,
    process_inbox,
    results_store,
    run_cli,
    sample_text,
)

DOCUMENTS, SAMPLE = 16, 4
MOODS = (
    "The team resolved every question quickly.",
    "The delivery was late, the box was damaged and the customer is angry.",
    "The parcel arrived on a Tuesday.",
)


class RenamedScale(DocumentAnalysis):
    """The built-in output with its sentiment scale renamed (and so answered anew)."""

    sentiment: Literal["favourable", "neutral", "unfavourable"]  # type: ignore[assignment]


def corpus(tmp_path: Path) -> list[str]:
    texts = {f"d{i}.txt": f"{sample_text(i)} {MOODS[i % 3]}" for i in range(DOCUMENTS)}
    report = process_inbox(make_inbox(tmp_path / "inbox", texts))
    assert report["counts"]["by_state"] == {"COMPLETED": DOCUMENTS}
    return sorted(d["document_id"] for d in report["documents"])


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_canary_compares_prices_and_is_reused_by_the_stale_backfill(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = corpus(tmp_path)
    code = main(["canary", "--sample", "3"])
    assert code == 2
    assert "no earlier version to compare with" in capsys.readouterr().err

    new_release(monkeypatch, version="v2", output_model=RenamedScale)
    before = simulator.stats()["total"]
    code, report = run_cli(capsys, "canary", "--sample", str(SAMPLE), "--seed", "7", "--json")

    assert code == 0
    assert simulator.stats()["total"] == before + SAMPLE
    assert (report["sample"], report["stale"], report["sample_calls"]) == (
        SAMPLE,
        DOCUMENTS,
        SAMPLE,
    )
    # Per field, what the stored rows say: the old results against the new checkpoints.
    store = results_store()
    current = current_task_suffix(Settings.load(), store.analysis)
    new = {
        d: json.loads(p["content"])
        for d in ids
        if (p := store.checkpoints.get(d + current)) is not None
    }
    assert len(new) == SAMPLE
    old = {r.document_id: r.output for r in store.results.get(list(new))}
    for field in ("sentiment", "summary"):
        agreeing = sum(old[d][field] == new[d][field] for d in new) / SAMPLE
        assert report["fields"][field]["agreement"] == pytest.approx(agreeing, abs=1e-4), field
    assert report["fields"]["sentiment"]["agreement"] < 1  # "positive" is no longer a value
    assert report["fields"]["summary"]["agreement"] == 1
    assert report["failures"] == {}
    # The results are untouched: every document is still stale.
    assert all(r.task_id != r.document_id + current for r in store.results.get(ids))

    # Again, the same seed: the same sample, answered from its checkpoints.
    code, again = run_cli(capsys, "canary", "--sample", str(SAMPLE), "--seed", "7", "--json")
    assert (code, again["sample_calls"]) == (0, 0)
    assert simulator.stats()["total"] == before + SAMPLE
    assert again["fields"] == report["fields"]

    # Decide, then act: the plan names the canary; a ceiling under its projection refuses.
    projected = report["projected"]["cost_usd"]
    code, plan = run_cli(capsys, "backfill", "--stale", "--dry-run", "--json")
    assert code == 0 and plan["canary"]["projected"]["cost_usd"] == projected
    assert main(["backfill", "--stale", "--dry-run", "--max-usd", str(projected / 2)]) == 2
    assert "over --max-usd" in capsys.readouterr().err

    spent = store.spend.total(ids).cost_usd
    launcher(instance).execute([d["document_id"] for d in plan["selected"]])
    assert simulator.stats()["total"] == before + DOCUMENTS  # the sample's documents: no call
    assert report["projected"]["documents"] == DOCUMENTS - SAMPLE
    measured = store.spend.total(ids).cost_usd - spent
    assert projected == pytest.approx(measured, rel=0.10)
    assert all(r.task_id == r.document_id + current for r in store.results.get(ids))


def test_a_canary_with_no_completed_documents_is_one_line(
    dagster_home: Path, simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["canary"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ai-pipeline: error: no completed documents in")


def test_a_canary_of_nothing_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["canary", "--sample", "0"]) == 2
    assert "--sample 0" in capsys.readouterr().err
