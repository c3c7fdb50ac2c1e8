"""The failure report: the asset (markdown and a PNG chart in the UI) and `ai-pipeline report`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.cli import main
from ai_pipeline.definitions import defs
from ai_pipeline_tests.support import doc_id, make_inbox, process_inbox, sample_text, task_of


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
    markdown = metadata["report"].value
    assert "| NETWORK_TIMEOUT | 1 |" in markdown and "| COMPLETED | 3 |" in markdown
    assert (
        metadata["chart"].value.startswith("![")
        and "data:image/png;base64," in metadata["chart"].value
    )
    chart = Path(metadata["chart_file"].value)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
