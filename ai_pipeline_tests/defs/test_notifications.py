"""Completion notices, exactly once, counted at a real idempotent receiver.

Every test runs documents through Dagster against the simulator, with ``AI_PIPELINE_WEBHOOK_URL``
pointing at a :class:`ReceiverServer`; "exactly once" is asserted where it matters, at the
receiver: how many notices it stored per Idempotency-Key and how many requests carried that key.
Network retries of a notice really sleep 1 s + 2 s, as in production.
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest

from ai_pipeline.cli import main
from ai_pipeline.defs.assets import ANALYSIS_RESULTS, COMPLETION_NOTICE
from ai_pipeline.rehearsal.receiver import ReceiverServer
from ai_pipeline.rehearsal.receiver_state import ReceiverConfig
from ai_pipeline.tasks import NOTIFY_STEP
from ai_pipeline_tests.support import (
    by_id,
    doc_id,
    kill_when,
    make_inbox,
    notice_key,
    process_inbox,
    results_store,
    sample_text,
    statuses,
    task_of,
)

STATUS = dg.AssetPartitionStatus
WEBHOOK_ENV = "AI_PIPELINE_WEBHOOK_URL"


def notice_metadata(instance: dg.DagsterInstance, document_id: str) -> dict[str, Any]:
    """The metadata of the latest completion_notice materialization of one document."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=COMPLETION_NOTICE, asset_partitions=[document_id]),
        limit=1,
    ).records
    assert records, f"no completion_notice materialization for {document_id}"
    metadata = records[0].asset_materialization.metadata  # type: ignore[union-attr]
    return {k: v.value for k, v in metadata.items()}


def rerun_range(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Re-execute every document's partition range through Dagster (the UI's "Re-execute")."""
    from ai_pipeline.definitions import defs
    from ai_pipeline.defs.jobs import ANALYSIS_JOB_NAME, range_tags

    keys = instance.get_dynamic_partitions("documents")
    return defs.resolve_job_def(ANALYSIS_JOB_NAME).execute_in_process(
        instance=instance, tags=range_tags(keys), raise_on_error=False
    )


def test_two_runs_and_a_forced_reexecution_send_each_notice_once(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """Running the same documents twice and re-executing their range POSTs each notice once."""
    texts = {"a.txt": sample_text(1), "b.txt": sample_text(2)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    ids = [doc_id(t) for t in texts.values()]

    first = process_inbox(inbox)
    second = process_inbox(inbox)
    result = rerun_range(instance)

    assert first["counts"]["by_state"] == {"COMPLETED": 2}
    assert second["runs"] == [], "nothing left to do on the second run"
    assert result.success
    store = results_store()
    for d in ids:
        key = notice_key(d)
        assert webhook_receiver.accepted(key) == 1
        assert webhook_receiver.requests_for(key) == 1
        assert store.checkpoints.get(key) == {"status": 201, "duplicate": False, "attempts": 1}
        assert simulator.requests_for(task_of(d)) == 1
    stats = webhook_receiver.stats()
    assert stats["requests"] == 2 and stats["by_status"] == {"201": 2}
    bodies = {n["key"]: n["body"] for n in stats["notices"]}
    assert {b["document_id"] for b in bodies.values()} == set(ids)
    assert all(b["analysis_task_id"] == task_of(b["document_id"]) for b in bodies.values())
    assert statuses(instance, COMPLETION_NOTICE, ids) == {d: STATUS.MATERIALIZED for d in ids}
    assert all(notice_metadata(instance, d)["task_id"] == notice_key(d) for d in ids)


def test_503_then_201_is_one_notice_after_one_retry(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """A 503 from the receiver is retried under the same key and the notice is stored once."""
    text = sample_text(11)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    key = notice_key(d)
    webhook_receiver.set_faults([{"kind": "status", "status": 503, "times": 1, "match": key}])

    report = process_inbox(inbox)

    assert by_id(report)[d]["state"] == "COMPLETED"
    assert webhook_receiver.accepted(key) == 1
    assert webhook_receiver.requests_for(key) == 2
    assert webhook_receiver.stats()["by_status"] == {"503": 1, "201": 1}
    assert results_store().checkpoints.get(key) == {
        "status": 201,
        "duplicate": False,
        "attempts": 2,
    }
    assert statuses(instance, COMPLETION_NOTICE, [d]) == {d: STATUS.MATERIALIZED}


def test_409_for_our_key_is_a_duplicate_treated_as_done(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """A receiver that already holds our key answers 409: the document completes, nothing new."""
    text = sample_text(12)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    key = notice_key(d)
    earlier = {"document_id": d, "note": "delivered by an earlier attempt"}
    seeded = httpx.post(webhook_receiver.url, json=earlier, headers={"Idempotency-Key": key})
    assert seeded.status_code == 201

    report = process_inbox(inbox)

    assert by_id(report)[d]["state"] == "COMPLETED"
    assert results_store().checkpoints.get(key) == {"status": 409, "duplicate": True, "attempts": 1}
    assert webhook_receiver.accepted(key) == 1
    assert webhook_receiver.requests_for(key) == 2
    assert [n["body"] for n in webhook_receiver.stats()["notices"]] == [earlier]
    assert statuses(instance, COMPLETION_NOTICE, [d]) == {d: STATUS.MATERIALIZED}
    meta = notice_metadata(instance, d)
    assert (meta["sent"], meta["status"], meta["duplicate"]) == (True, 409, True)
    assert results_store().events.failures(d) == []


def test_business_rejection_goes_to_review_and_5xx_ends_as_network_timeout(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """A 422 is BUSINESS_REJECTED after one request; a persistent 503 is NETWORK_TIMEOUT after 3."""
    texts = {
        "rejected.txt": sample_text(21),
        "down.txt": sample_text(22),
        "ok.txt": sample_text(23),
    }
    inbox = make_inbox(tmp_path / "inbox", texts)
    rejected, down, ok = (doc_id(t) for t in texts.values())
    webhook_receiver.set_faults(
        [
            {
                "kind": "status",
                "status": 422,
                "code": "INSUFFICIENT_BALANCE",
                "error": "the account balance is too low",
                "match": notice_key(rejected),
            },
            {"kind": "status", "status": 503, "match": notice_key(down)},
        ]
    )

    report = process_inbox(inbox)

    docs = by_id(report)
    store = results_store()
    # 422: never retried, a person decides.
    assert (docs[rejected]["state"], docs[rejected]["category"]) == ("FAILED", "BUSINESS_REJECTED")
    assert webhook_receiver.requests_for(notice_key(rejected)) == 1
    assert webhook_receiver.accepted(notice_key(rejected)) == 0
    review = store.reviews.get(rejected)
    assert review is not None and review.status == "open"
    assert review.category == "BUSINESS_REJECTED"
    assert "INSUFFICIENT_BALANCE" in review.error and "422" in review.error
    # Persistent 503: the network rule, two retries under the same key, then NETWORK_TIMEOUT.
    assert (docs[down]["state"], docs[down]["category"]) == ("FAILED", "NETWORK_TIMEOUT")
    assert webhook_receiver.requests_for(notice_key(down)) == 3
    assert webhook_receiver.accepted(notice_key(down)) == 0
    assert store.reviews.get(down) is None
    # Neither failure leaves a notice checkpoint; the healthy document got its notice.
    assert store.checkpoints.get(notice_key(rejected)) is None
    assert store.checkpoints.get(notice_key(down)) is None
    assert docs[ok]["state"] == "COMPLETED"
    assert webhook_receiver.accepted(notice_key(ok)) == 1
    assert webhook_receiver.stats()["accepted_by_key"] == {notice_key(ok): 1}
    ids = [rejected, down, ok]
    assert statuses(instance, COMPLETION_NOTICE, ids) == {
        rejected: STATUS.FAILED,
        down: STATUS.FAILED,
        ok: STATUS.MATERIALIZED,
    }
    # The analysis itself was stored before the notice was attempted: a rerun pays no LLM call.
    assert statuses(instance, ANALYSIS_RESULTS, ids) == {d: STATUS.MATERIALIZED for d in ids}
    assert {simulator.requests_for(task_of(d)) for d in ids} == {1}


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import ai_pipeline.store.checkpoints as checkpoints_module

    original = checkpoints_module.Checkpoints.put

    def stall_after_notice(self, task_id, document_id, step, payload):
        # The notice has been POSTed and answered; stall before its checkpoint is written so that
        # the parent can kill the run inside that window. Everything else is the real code.
        if step == "notify":
            time.sleep(600)
        return original(self, task_id, document_id, step, payload)

    checkpoints_module.Checkpoints.put = stall_after_notice
    from ai_pipeline.cli import main
    sys.exit(main(["run", "--inbox", sys.argv[1], "--json"]))
    """
)


def test_sigkill_between_post_and_checkpoint_is_a_409_on_resume(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """A run killed after the receiver stored the notice but before our checkpoint resends once."""
    text = sample_text(31)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    key = notice_key(d)
    store = results_store()
    kill_when(
        KILL_SCRIPT,
        [str(inbox)],
        lambda: webhook_receiver.stats()["by_status"].get("201") == 1,
        tmp_path,
        settle=0.3,  # the 201 reaches the client, which then stalls in put_checkpoint
    )
    assert webhook_receiver.accepted(key) == 1
    assert store.checkpoints.get(key) is None, "killed before the local checkpoint"
    assert store.documents.get(d).state == "RUNNING"  # type: ignore[union-attr]

    report = process_inbox(inbox)

    assert by_id(report)[d]["state"] == "COMPLETED"
    assert webhook_receiver.accepted(key) == 1
    assert webhook_receiver.requests_for(key) == 2
    assert webhook_receiver.stats()["by_status"] == {"201": 1, "409": 1}
    assert store.checkpoints.get(key) == {"status": 409, "duplicate": True, "attempts": 1}
    assert [r.document_id for r in store.results.get()] == [d]
    assert simulator.requests_for(task_of(d)) == 1, "the LLM answer was checkpointed"
    assert statuses(instance, COMPLETION_NOTICE, [d]) == {d: STATUS.MATERIALIZED}


def test_no_notice_for_a_document_that_failed_a_check(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """A refused or hallucinated answer never produces a notice, not even on later runs."""
    texts = {
        "refused.txt": sample_text(41),
        "invented.txt": sample_text(42),
        "ok.txt": sample_text(43),
    }
    inbox = make_inbox(tmp_path / "inbox", texts)
    refused, invented, ok = (doc_id(t) for t in texts.values())
    simulator.set_faults(
        [
            {"kind": "refuse", "match": task_of(refused)},
            {"kind": "hallucinate", "match": task_of(invented)},
        ]
    )

    first = process_inbox(inbox)
    simulator.set_faults([])
    again = process_inbox(inbox)

    for report in (first, again):
        docs = by_id(report)
        assert (docs[refused]["state"], docs[refused]["category"]) == ("FAILED", "MODEL_REFUSAL")
        assert (docs[invented]["state"], docs[invented]["category"]) == (
            "FAILED",
            "MODEL_HALLUCINATION",
        )
        assert docs[ok]["state"] == "COMPLETED"
    for d in (refused, invented):
        assert webhook_receiver.requests_for(notice_key(d)) == 0
        assert results_store().checkpoints.get(notice_key(d)) is None
        assert simulator.requests_for(task_of(d)) == 1, "the failed answer is checkpointed"
    assert webhook_receiver.stats()["requests_by_key"] == {notice_key(ok): 1}
    assert webhook_receiver.accepted(notice_key(ok)) == 1


def test_no_notice_for_a_document_rejected_by_a_reviewer(
    instance: dg.DagsterInstance,
    simulator,
    webhook_receiver: ReceiverServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A document a reviewer rejected never triggers a notice, even when the inbox is run again."""
    texts = {"bad-scan.txt": "Smudged scan for Vega Instruments. " + sample_text(44)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    d = doc_id(texts["bad-scan.txt"])
    simulator.set_faults([{"kind": "status", "status": 400, "match": "Smudged scan"}])
    process_inbox(inbox)
    assert main(["review", "reject", d, "--reason", "文件损坏", "--by", "qa", "--json"]) == 0
    capsys.readouterr()

    simulator.set_faults([])
    report = process_inbox(inbox)

    # (notices POSTed for it, its state, its results rows)
    observed = (
        webhook_receiver.requests_for(notice_key(d)),
        by_id(report)[d]["state"],
        len(results_store().results.get([d])),
    )
    assert observed == (0, "FAILED", 0)


def test_no_webhook_configured_materializes_the_notice_as_not_sent(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without AI_PIPELINE_WEBHOOK_URL the notice stage is done with sent=False and nothing POSTed."""
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    text = sample_text(51)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    with ReceiverServer() as idle:
        report = process_inbox(inbox)
        assert idle.stats()["requests"] == 0

    assert by_id(report)[d]["state"] == "COMPLETED"
    assert statuses(instance, COMPLETION_NOTICE, [d]) == {d: STATUS.MATERIALIZED}
    meta = notice_metadata(instance, d)
    assert meta["sent"] is False
    assert "AI_PIPELINE_WEBHOOK_URL" in meta["reason"]
    assert results_store().checkpoints.count(NOTIFY_STEP) == 0


# --- 5.3 幂等性验证 (the idempotency checklist) --------------------------------------------


def test_seed_5_3_1_same_task_id_twice_second_gets_409_and_one_record_exists(
    instance: dg.DagsterInstance, simulator, webhook_receiver: ReceiverServer, tmp_path: Path
) -> None:
    """§5.3 item 1: the same task id sent twice gets HTTP 409 the second time; one record exists."""
    text = sample_text(61)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    key = notice_key(d)
    process_inbox(inbox)
    assert webhook_receiver.accepted(key) == 1
    store = results_store()
    # Lose our record of the delivery, so that the next run sends the same task id again.
    assert store.checkpoints.delete(key)

    result = rerun_range(instance)

    assert result.success
    assert webhook_receiver.requests_for(key) == 2
    assert webhook_receiver.stats()["by_status"] == {"201": 1, "409": 1}
    assert webhook_receiver.accepted(key) == 1
    assert [n["key"] for n in webhook_receiver.stats()["notices"]] == [key]
    assert store.checkpoints.get(key) == {"status": 409, "duplicate": True, "attempts": 1}
    assert store.documents.get(d).state == "COMPLETED"  # type: ignore[union-attr]
    assert store.results.count() == 1
    assert [r.document_id for r in store.results.get()] == [d]


def test_seed_5_3_3_downstream_restarted_after_first_request_still_recognises_the_key(
    instance: dg.DagsterInstance,
    simulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§5.3 item 3: a receiver killed right after storing a notice still knows its key on restart."""
    text = sample_text(63)
    inbox = make_inbox(tmp_path / "inbox", {"one.txt": text})
    d = doc_id(text)
    key = notice_key(d)
    state_file = tmp_path / "receiver-state.sqlite"
    # It stores the notice, and the answer is lost: the connection drops, then the process goes.
    first = ReceiverServer(
        ReceiverConfig(state_file=str(state_file), faults=[{"kind": "accept_then_reset"}])
    ).start()
    port = first.port
    monkeypatch.setenv(WEBHOOK_ENV, first.url)

    def stop_after_first_notice() -> None:
        deadline = time.monotonic() + 60
        while first.accepted(key) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.stop()

    stopper = threading.Thread(target=stop_after_first_notice, daemon=True)
    stopper.start()
    try:
        down = process_inbox(inbox)
    finally:
        stopper.join(timeout=30)
        first.stop()
    assert (by_id(down)[d]["state"], by_id(down)[d]["category"]) == ("FAILED", "NETWORK_TIMEOUT")
    assert results_store().checkpoints.get(key) is None

    with ReceiverServer(ReceiverConfig(state_file=str(state_file)), port=port) as restarted:
        assert restarted.url == first.url
        assert restarted.accepted(key) == 1, "the restarted receiver read its state file"
        report = process_inbox(inbox)

        assert by_id(report)[d]["state"] == "COMPLETED"
        assert restarted.requests_for(key) == 1
        assert restarted.stats()["by_status"] == {"409": 1}
        assert restarted.accepted(key) == 1
    assert results_store().checkpoints.get(key) == {"status": 409, "duplicate": True, "attempts": 1}
    assert simulator.requests_for(task_of(d)) == 1
    assert results_store().results.count() == 1
