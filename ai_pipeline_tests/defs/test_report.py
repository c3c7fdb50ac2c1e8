"""The failure report: the asset (markdown and a PNG chart in the UI) and `ai-pipeline report`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.cli import main
from ai_pipeline.definitions import defs
from ai_pipeline.states import State
from ai_pipeline_tests.support import (
    doc_id,
    launcher,
    make_inbox,
    process_inbox,
    results_store,
    sample_text,
    task_of,
)


def test_report_counts_failures_and_tokens_in_the_asset_and_the_cli(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The report counts states and categories, failures by day, tokens and cost, in both views."""
    texts = {f"ok-{i}.txt": sample_text(900 + i) for i in range(3)}
    texts["net.txt"] = sample_text(950)
    texts["empty.txt"] = ""
    inbox = make_inbox(tmp_path / "inbox", texts)
    simulator.set_faults(
        [{"kind": "status", "status": 503, "match": task_of(doc_id(sample_text(950)))}]
    )
    process_inbox(inbox)

    capsys.readouterr()
    assert main(["report", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["documents"] == 5
    assert report["by_state"] == {"COMPLETED": 3, "FAILED": 2}
    assert report["by_category"] == {"INPUT_QUALITY_ISSUE": 1, "NETWORK_TIMEOUT": 1}
    assert report["success_rate"] == 0.6
    assert report["results_rows"] == 3
    assert report["tokens"]["prompt"] > 0 and report["tokens"]["completion"] > 0
    assert report["estimated_cost_usd"] > 0
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    # Two retried requests and the final failure of the network document, one for the empty file.
    assert report["failures_by_day"] == {today: {"INPUT_QUALITY_ISSUE": 1, "NETWORK_TIMEOUT": 3}}
    assert sorted(d["category"] for d in report["failed_documents"]) == [
        "INPUT_QUALITY_ISSUE",
        "NETWORK_TIMEOUT",
    ]

    result = defs.resolve_job_def("failure_report_job").execute_in_process(instance=instance)
    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey("failure_report"))
    assert event is not None and event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["documents"].value == 5
    assert metadata["success_rate"].value == 0.6
    assert metadata["failed"].value == 2
    assert metadata["unfinished"].value == 0 and metadata["cancelled"].value == 0
    markdown = metadata["report"].value
    assert "| NETWORK_TIMEOUT | 1 |" in markdown and "| COMPLETED | 3 |" in markdown
    assert (
        metadata["chart"].value.startswith("![")
        and "data:image/png;base64," in metadata["chart"].value
    )
    chart = Path(metadata["chart_file"].value)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_counts_as_failed_only_the_failed_and_the_dead_letter(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """failure_report's `failed` counts the FAILED and DEAD_LETTER documents only; those waiting
    or running are `unfinished`, the cancelled `cancelled`."""
    texts = {"ok.txt": sample_text(970)}
    texts |= {f"poison-{i}.txt": f"Poison request {i}. " + sample_text(971 + i) for i in range(2)}
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Poison request"}])
    process_inbox(make_inbox(tmp_path / "inbox", texts))
    later = {f"later-{i}.txt": sample_text(980 + i) for i in range(3)}
    launcher().register_inbox(make_inbox(tmp_path / "later", later))
    store = results_store()
    store.documents.transition(doc_id(texts["poison-0.txt"]), State.DEAD_LETTER)
    store.documents.transition(doc_id(later["later-0.txt"]), State.QUEUED)
    store.documents.transition(doc_id(later["later-1.txt"]), State.CANCELLED)

    result = defs.resolve_job_def("failure_report_job").execute_in_process(instance=instance)

    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey("failure_report"))
    assert event is not None and event.asset_materialization is not None
    counts = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert counts["documents"] == 6
    assert (counts["failed"], counts["unfinished"], counts["cancelled"]) == (2, 2, 1)


def test_report_spend_matches_the_recorded_usage_in_total_by_category_re_analyses_and_batch(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The spend of ``report --json``, its text and the failure_report asset's metadata are the
    sums of the recorded attempts: in all, of the refused document (its category), of the one
    re-analysed under a new prompt version, and per batch."""
    from ai_pipeline.intake import batch_key
    from ai_pipeline.tasks import ANALYSE_STEP, task_id
    from ai_pipeline_tests.support import TEST_MODEL, launcher, new_release, results_store

    first = {f"a{i}.txt": sample_text(700 + i) for i in range(2)}
    first["refused.txt"] = sample_text(790)
    refused = doc_id(sample_text(790))
    simulator.set_faults([{"kind": "refuse", "match": task_of(refused)}])
    process_inbox(make_inbox(tmp_path / "first", first))
    second = {"b.txt": sample_text(800)}
    process_inbox(make_inbox(tmp_path / "second", second))
    store = results_store()
    alpha = [doc_id(t) for t in first.values()]
    beta = [doc_id(t) for t in second.values()]
    store.batches.save(batch_key(alpha), "alpha", alpha)
    store.batches.save(batch_key(beta), "beta", beta)
    again = doc_id(sample_text(700))
    new_release(monkeypatch, version="v2")
    launcher().execute([again])

    rows = store.spend.attempts(alpha + beta)
    assert len(rows) == 5 == simulator.stats()["total"]
    assert (
        sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
        == (simulator.stats()["tokens"])
    )

    def cost(wanted: list[dict]) -> float:
        return round(sum(r["cost_usd"] for r in wanted), 6)

    v2 = task_id(again, ANALYSE_STEP, "v2", TEST_MODEL)
    refused_rows = [r for r in rows if r["document_id"] == refused]
    reanalysis = [r for r in rows if r["task_id"] == v2]
    assert len(refused_rows) == 1 and len(reanalysis) == 1 and cost(reanalysis) > 0

    code = main(["report", "--json"])
    spend = json.loads(capsys.readouterr().out)["spend"]

    assert code == 0
    assert spend["total"]["attempts"] == 5
    assert spend["total"]["cost_usd"] == pytest.approx(cost(rows), abs=1e-6)
    assert list(spend["failures_by_category"]) == ["MODEL_REFUSAL"]
    assert spend["failures_by_category"]["MODEL_REFUSAL"]["cost_usd"] == pytest.approx(
        cost(refused_rows), abs=1e-6
    )
    assert spend["reanalyses"]["attempts"] == 1
    assert spend["reanalyses"]["cost_usd"] == pytest.approx(cost(reanalysis), abs=1e-6)
    by_batch = spend["by_batch"]
    assert {b["name"]: (b["documents"], b["attempts"]) for b in by_batch.values()} == {
        "alpha": (3, 4),
        "beta": (1, 1),
    }
    assert by_batch[batch_key(alpha)]["cost_usd"] == pytest.approx(
        cost([r for r in rows if r["document_id"] in alpha]), abs=1e-6
    )

    assert main(["report"]) == 0
    text = capsys.readouterr().out
    assert f"**spent** ${cost(rows):.4f} over 5 LLM attempts" in text
    assert f"re-analyses ${cost(reanalysis):.4f}" in text
    assert f"| alpha ({batch_key(alpha)}) | 3 | 4 |" in text
    assert f"| beta ({batch_key(beta)}) | 1 | 1 |" in text

    result = defs.resolve_job_def("failure_report_job").execute_in_process(instance=instance)
    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey("failure_report"))
    assert event is not None and event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["spent_usd"].value == pytest.approx(cost(rows), abs=1e-6)
    assert metadata["failures_cost_usd"].value == pytest.approx(cost(refused_rows), abs=1e-6)
    assert metadata["reanalyses_cost_usd"].value == pytest.approx(cost(reanalysis), abs=1e-6)
    assert metadata["spend_by_batch"].value == by_batch
    assert f"| alpha ({batch_key(alpha)}) | 3 | 4 |" in metadata["report"].value


def test_the_report_and_the_trace_show_cached_and_reasoning_tokens(
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """o4-mini at the simulator in OpenAI rules mode, on documents sharing a long opening: the
    report (JSON and text), the failure_report asset's metadata and the trace show the cached
    prompt tokens and the reasoning tokens the usage table recorded."""
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer
    from ai_pipeline_tests.support import point_llm_at, results_store

    preamble = " ".join(sample_text(8000 + k) for k in range(30))
    texts = {f"d{i}.txt": f"{preamble} {sample_text(1200 + i)}" for i in range(3)}
    with SimulatorServer(SimulatorConfig(openai_rules=True)) as server:
        point_llm_at(monkeypatch, server, concurrency=1)
        monkeypatch.setenv("AI_PIPELINE_MODEL", "o4-mini")
        out = process_inbox(make_inbox(tmp_path / "inbox", texts))
    assert out["counts"]["by_state"] == {"COMPLETED": 3}
    store = results_store()
    ids = [doc_id(t) for t in texts.values()]
    attempts = store.spend.attempts(ids)
    cached = sum(a["cached_tokens"] for a in attempts)
    reasoning = sum(a["reasoning_tokens"] for a in attempts)
    assert cached >= 2 * 1024 and reasoning > 0  # the second and third found the opening cached

    capsys.readouterr()
    assert main(["report", "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["spend"]["total"]
    assert (total["cached_tokens"], total["reasoning_tokens"]) == (cached, reasoning)
    assert main(["report"]) == 0
    text = capsys.readouterr().out
    assert f"{cached} of them cached" in text and f"{reasoning} of them reasoning" in text

    result = defs.resolve_job_def("failure_report_job").execute_in_process(instance=instance)
    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey("failure_report"))
    assert event is not None and event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["cached_prompt_tokens"].value == cached
    assert metadata["reasoning_tokens"].value == reasoning
    assert f"{cached} of them cached" in metadata["report"].value

    last = attempts[-1]
    assert main(["trace", "--json", last["document_id"]]) == 0
    story = json.loads(capsys.readouterr().out)
    (event_,) = [e for e in story["events"] if e["kind"] == "llm_attempt"]
    assert (event_["cached_tokens"], event_["reasoning_tokens"]) == (
        last["cached_tokens"],
        last["reasoning_tokens"],
    )
    assert story["spend"]["cached_tokens"] == last["cached_tokens"] > 0
    assert main(["trace", last["document_id"]]) == 0
    text = capsys.readouterr().out
    assert f"{last['cached_tokens']} of them cached" in text
    assert f"{last['reasoning_tokens']} of them reasoning" in text
    assert f"({last['cached_tokens']} cached prompt, {last['reasoning_tokens']} reasoning)" in text
