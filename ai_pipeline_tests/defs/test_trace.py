"""``ai-pipeline trace``: one id, the document's whole story in time order."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline_tests.support import doc_id, make_inbox, process_inbox, run_cli, task_of

TEXT = (
    "Memo for Corvid Analytics in Porto. Maria Sousa reviewed the quarterly figures and asked "
    "the team to prepare the budget."
)


def test_two_retries_a_refusal_and_a_rejection_in_order(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inbox = make_inbox(tmp_path / "inbox", {"memo.txt": TEXT})
    document, task = doc_id(TEXT), task_of(doc_id(TEXT))
    simulator.set_faults(
        [
            {"kind": "status", "status": 503, "times": 2, "match": task},
            {"kind": "refuse", "match": task},
        ]
    )
    report = process_inbox(inbox)
    assert report["documents"][0]["category"] == "MODEL_REFUSAL"
    code, _ = run_cli(capsys, "review", "reject", document, "--reason", "内容不完整", "--json")
    assert code == 0

    code, story = run_cli(capsys, "trace", task, "--json")

    assert code == 0
    assert (story["document_id"], story["state"], story["category"]) == (
        document,
        "FAILED",
        "MODEL_REFUSAL",
    )
    events = story["events"]
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    kinds = [(e["kind"], e.get("outcome") or e.get("category") or "") for e in events]

    def position(kind: str, what: str = "", after: int = -1) -> int:
        return next(
            i for i, k in enumerate(kinds) if i > after and k[0] == kind and what in (k[1], "")
        )

    first_retry = position("failure", "NETWORK_TIMEOUT")
    second_retry = position("failure", "NETWORK_TIMEOUT", first_retry)
    answer = position("llm_attempt", "answer")
    refusal = position("failure", "MODEL_REFUSAL")
    rejected = next(i for i, e in enumerate(events) if "REVIEW_REJECTED" in e["detail"])
    assert position("registered") < first_retry < second_retry < answer < refusal < rejected
    assert [e["outcome"] for e in events if e["kind"] == "llm_attempt"] == [
        "NETWORK_TIMEOUT",
        "NETWORK_TIMEOUT",
        "answer",
    ]
    failed_checks = [e["detail"] for e in events if e["kind"] == "check" and not e["passed"]]
    assert any("refusal" in c for c in failed_checks), failed_checks
    assert any(e["kind"] == "message" for e in events[refusal:])
    assert [e["kind"] for e in events].count("run") == 2  # started, ended
    assert story["spend"]["attempts"] == 3
    assert story["spend"]["prompt_tokens"] + story["spend"]["completion_tokens"] == (
        simulator.tokens_for(task)
    )
    assert story["spend"]["cost_usd"] > 0
    assert {e["task_id"] for e in events if e["kind"] in ("llm_attempt", "failure")} == {task}

    # The same story for a person: one line per event, the retries before the refusal.
    capsys.readouterr()
    from ai_pipeline.cli import main

    assert main(["trace", document]) == 0
    header, spent, lines = capsys.readouterr().out.split("\n", 2)
    assert "FAILED MODEL_REFUSAL" in header and "3 LLM attempts" in spent
    assert lines.index("NETWORK_TIMEOUT") < lines.index("MODEL_REFUSAL") < lines.index("REJECTED")


def test_an_unknown_id_is_a_usage_error(
    instance: dg.DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    from ai_pipeline.cli import main

    assert main(["trace", "feedfacefeedfacefeed-analyse-v1-abc"]) == 2
    assert "no document or task" in capsys.readouterr().err
