"""The idempotency pre-launch checklist, items 5.1 to 5.3, checked by hand no more.

5.1 task id generation, 5.2 the circuit breaker's configuration, 5.3 idempotency: each test is
named after its checklist item and runs through Dagster against the simulator on both backends
wherever Dagster is involved. Items about infrastructure this project does not have (Kafka, Redis
TTLs, a payment gateway) are covered by what stands in for them here: the results database, the
simulator's Idempotency-Key counts and Dagster's run log.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.defs.assets import ANALYSIS_RESULTS, LLM_ANALYSIS
from ai_pipeline.documents import content_id, read_document
from ai_pipeline.failures import Category, Disposition, category_for_status
from ai_pipeline.intake import register_files
from ai_pipeline.store.results import Results
from ai_pipeline.tasks import ANALYSE_STEP
from ai_pipeline_tests.support import (
    EXAMPLES,
    doc_id,
    make_inbox,
    process_inbox,
    results_store,
    sample_text,
    statuses,
    task_of,
    user_messages,
)

STATUS = dg.AssetPartitionStatus
PDF = EXAMPLES / "inbox" / "q3-report-northwind.pdf"
TASK_PREFIX = re.compile(r"^\[TASK:([^\]]*)\]")
FIXED_REFUSAL_PROMPT = "请回答'我不知道'"


def _one_byte_modified(data: bytes) -> bytes:
    """The PDF with one byte changed in place (a hex digit of the trailer's /ID): still valid."""
    at = data.index(b"<", data.rindex(b"/ID")) + 1
    replacement = b"0" if data[at : at + 1] != b"0" else b"1"
    return data[:at] + replacement + data[at + 1 :]


# --- 5.1 task id generation -----------------------------------------------------------------------


def test_5_1_same_pdf_five_times_gives_five_byte_identical_task_ids(
    dagster_home: Path, tmp_path: Path
) -> None:
    """The same PDF submitted five times yields five task ids that are identical byte for byte."""
    copies = []
    for i in range(5):
        copies.append(tmp_path / "inbox" / f"copy-{i}" / f"northwind-{i}.pdf")
        copies[-1].parent.mkdir(parents=True)
        shutil.copy(PDF, copies[-1])
    store = results_store()

    registered = [register_files(store, [path], max_bytes=10_000_000)[0] for path in copies]

    task_ids = [task_of(r.document_id).encode("utf-8") for r in registered]
    assert len(task_ids) == 5 and len(set(task_ids)) == 1
    assert {r.document_id for r in registered} == {content_id(PDF.read_bytes())}
    assert task_ids[0] == task_of(content_id(PDF.read_bytes())).encode("utf-8")
    assert len(store.documents.rows()) == 1
    assert sorted(Path(s).name for s in store.documents.sources()[registered[0].document_id]) == [
        f"northwind-{i}.pdf" for i in range(5)
    ]


@pytest.mark.parametrize("change", ["one byte modified in place", "one byte appended"])
def test_5_1_one_modified_byte_gives_a_completely_different_task_id(
    tmp_path: Path, change: str
) -> None:
    """Changing one byte of the PDF yields a task id completely different from the old one."""
    data = PDF.read_bytes()
    modified = _one_byte_modified(data) if change.endswith("in place") else data + b"\n"
    assert len(modified) - len(data) in (0, 1)
    assert sum(a != b for a, b in zip(data, modified, strict=False)) <= 1
    original, changed = tmp_path / "original.pdf", tmp_path / "changed.pdf"
    original.write_bytes(data)
    changed.write_bytes(modified)

    before, after = read_document(original), read_document(changed)

    # Still a readable PDF with the very same text: only the bytes differ.
    assert after.text == before.text
    assert after.document_id != before.document_id
    old, new = task_of(before.document_id), task_of(after.document_id)
    assert old != new
    differing = sum(a != b for a, b in zip(before.document_id, after.document_id, strict=True))
    assert differing > len(before.document_id) // 2, "not a near-miss of the old id"


def test_5_1_task_id_is_identical_at_the_endpoint_in_the_database_and_in_the_logs(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """The task id in every log and store downstream equals the generated one, never truncated."""
    inbox = make_inbox(tmp_path / "inbox", {"other.txt": sample_text(1)})
    shutil.copy(PDF, inbox / "northwind.pdf")
    pdf_id = content_id(PDF.read_bytes())
    generated = task_of(pdf_id)

    report = process_inbox(inbox)

    assert report["counts"]["by_state"] == {"COMPLETED": 2}
    # The endpoint: the Idempotency-Key of the one request that analysed the PDF.
    keys = [r["key"] for r in simulator.stats()["requests"] if r["key"].startswith(pdf_id)]
    assert keys == [generated]
    # The database: the document's row and its results row.
    store = results_store()
    assert store.documents.get(pdf_id).task_id == generated  # type: ignore[union-attr]
    assert [r.task_id for r in store.results.get([pdf_id])] == [generated]
    # Dagster: every log line about the document, and the materialization's metadata.
    lines = [m for m in user_messages(instance, report["runs"][0]["run_id"]) if pdf_id in m]
    assert lines
    prefixes = [TASK_PREFIX.match(m) for m in lines]
    assert all(prefixes), "every line about the document starts with [TASK:…]"
    assert {p.group(1) for p in prefixes if p} == {generated}
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=LLM_ANALYSIS, asset_partitions=[pdf_id]), limit=1
    ).records[0]
    materialization = record.event_log_entry.asset_materialization
    assert materialization is not None
    assert materialization.metadata["task_id"].value == generated


# --- 5.2 circuit breaker configuration ------------------------------------------------------------


def test_5_2_half_the_packets_lost_retries_at_most_twice_and_the_third_failure_is_network_timeout(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """With half the requests lost, a task is retried at most twice and a third loss fails it."""
    lost_text = "Unreachable ledger for Kestrel Freight in Bergen. " + sample_text(50)
    texts = {f"doc-{i}.txt": sample_text(40 + i) for i in range(4)}
    inbox = make_inbox(tmp_path / "inbox", {**texts, "lost.txt": lost_text})
    good = [doc_id(t) for t in texts.values()]
    lost = doc_id(lost_text)
    # The document whose every request is lost first, then every second request of the rest.
    # Four other documents: with a fifth, the alternation would hit one of them three times in a
    # row too, which is the policy working (NETWORK_TIMEOUT), not a flaky test.
    simulator.set_faults(
        [{"kind": "reset", "match": "Unreachable ledger"}, {"kind": "reset", "every": 2}]
    )

    report = process_inbox(inbox)

    by_id = {d["document_id"]: d for d in report["documents"]}
    assert all(by_id[g]["state"] == "COMPLETED" for g in good)
    per_task = [simulator.requests_for(task_of(g)) for g in good]
    assert max(per_task) <= 3
    # 7 requests for 4 documents, every second one reset: first tries, then retries 1 and 2.
    assert sorted(per_task) == [1, 1, 2, 3]
    assert (by_id[lost]["state"], by_id[lost]["category"]) == ("FAILED", "NETWORK_TIMEOUT")
    assert simulator.requests_for(task_of(lost)) == 3
    assert simulator.stats()["by_status"] == {"200": 4, "reset": 6}
    events = results_store().events.failures(lost)
    assert [e.category for e in events] == ["NETWORK_TIMEOUT"] * 3
    messages = user_messages(instance, report["runs"][0]["run_id"])
    retries = [m for m in messages if f"for TASK:{task_of(lost)}]" in m and "[RETRY #" in m]
    assert [re.search(r"\[RETRY #(\d+)", m).group(1) for m in retries] == ["1", "2"]
    assert statuses(instance, ANALYSIS_RESULTS, [*good, lost]) == {
        g: STATUS.MATERIALIZED for g in good
    } | {lost: STATUS.FAILED}


def test_5_2_invalid_token_is_not_retried_but_refreshed_and_resubmitted_under_the_same_task_id(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An invalid token is refreshed at once and the same task id is resubmitted, no blind retry."""
    simulator.set_api_keys({"fresh-key"})  # the configured OPENAI_API_KEY is now invalid
    key_file = tmp_path / "api-key"
    key_file.write_text("fresh-key\n")
    monkeypatch.setenv("AI_PIPELINE_API_KEY_FILE", str(key_file))
    text = sample_text(60)
    inbox = make_inbox(tmp_path / "inbox", {"only.txt": text})
    task = task_of(doc_id(text))

    report = process_inbox(inbox)

    assert report["counts"]["by_state"] == {"COMPLETED": 1}
    requests = simulator.stats()["requests"]
    assert [(r["key"], r["status"], r["authorized"]) for r in requests] == [
        (task, 401, False),
        (task, 200, True),
    ]
    events = results_store().events.failures(doc_id(text))
    assert [e.category for e in events] == ["AUTH_FAILED"]
    assert "refreshed" in events[0].error
    messages = user_messages(instance, report["runs"][0]["run_id"])
    assert any(m.startswith(f"[TASK:{task}] [AUTH for TASK:{task}]") for m in messages)
    assert not any("[RETRY #" in m for m in messages)
    assert len(results_store().results.get([doc_id(text)])) == 1


def test_5_2_fixed_prompt_please_answer_i_dont_know_is_intercepted_as_model_refusal(
    instance: dg.DagsterInstance, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixed prompt 请回答'我不知道' is intercepted, marked MODEL_REFUSAL, nothing downstream."""
    upserted: list[Any] = []
    original = Results.upsert

    def spy(self: Results, rows: Any) -> int:
        upserted.extend(rows)
        return original(self, rows)

    monkeypatch.setattr(Results, "upsert", spy)
    good_text = sample_text(70)
    inbox = make_inbox(
        tmp_path / "inbox", {"prompt.txt": FIXED_REFUSAL_PROMPT, "good.txt": good_text}
    )
    refused, good = doc_id(FIXED_REFUSAL_PROMPT), doc_id(good_text)

    report = process_inbox(inbox)

    assert [r["fault"] for r in simulator.stats()["requests"] if r["key"] == task_of(refused)] == [
        "dont_know"
    ]
    by_id = {d["document_id"]: d for d in report["documents"]}
    assert (by_id[refused]["state"], by_id[refused]["category"]) == ("FAILED", "MODEL_REFUSAL")
    assert by_id[good]["state"] == "COMPLETED"
    # No downstream call: the results upsert never saw the document (it did see the other one).
    assert [r.document_id for r in upserted] == [good]
    store = results_store()
    assert [r.document_id for r in store.results.get()] == [good]
    assert [e.category for e in store.events.failures(refused)] == ["MODEL_REFUSAL"]
    assert [(r.document_id, r.category) for r in store.reviews.items()] == [
        (refused, "MODEL_REFUSAL")
    ]
    assert statuses(instance, ANALYSIS_RESULTS, [refused, good]) == {
        refused: STATUS.FAILED,
        good: STATUS.MATERIALIZED,
    }
    history = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(LLM_ANALYSIS, "refusal"), limit=10
    )
    assert {r.partition: r.status.value for r in history} == {
        refused: "FAILED",
        good: "SUCCEEDED",
    }


# --- 5.3 idempotency ------------------------------------------------------------------------------


def test_5_3_same_task_id_twice_leaves_one_record_and_one_call__downstream_webhook_409_later(
    instance: dg.DagsterInstance, simulator, tmp_path: Path
) -> None:
    """The same task id submitted twice leaves one record (the webhook's 409 half comes later)."""
    from ai_pipeline.definitions import defs

    texts = {"a.txt": sample_text(80), "b.txt": sample_text(81)}
    inbox = make_inbox(tmp_path / "inbox", texts)
    the_id = doc_id(texts["a.txt"])
    task = task_of(the_id)

    first = process_inbox(inbox)
    second = process_inbox(inbox)
    forced = defs.resolve_job_def("analyse_documents_job").execute_in_process(
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": the_id,
            "dagster/asset_partition_range_end": the_id,
        },
    )

    assert first["counts"]["by_state"] == {"COMPLETED": 2}
    assert second["runs"] == [] and second["counts"]["by_state"] == {"COMPLETED": 2}
    assert forced.success
    store = results_store()
    rows = store.results.get([the_id])
    assert len(rows) == 1 and rows[0].task_id == task
    assert store.results.count() == 2
    assert simulator.requests_for(task) == 1
    assert simulator.stats()["total"] == 2
    assert store.checkpoints.count(ANALYSE_STEP) == 2
    assert statuses(instance, ANALYSIS_RESULTS, [the_id]) == {the_id: STATUS.MATERIALIZED}


def test_5_3_downstream_http_409_is_duplicate_execution_treated_as_done() -> None:
    """A downstream HTTP 409 for a task id it already has is DUPLICATE_EXECUTION: done."""
    category = category_for_status(409, downstream=True)

    assert category is Category.DUPLICATE_EXECUTION
    assert category.rule.disposition is Disposition.DONE
    assert not category.retryable and not category.needs_person
    # From the LLM endpoint a 409 means our key is still in flight there: a network matter.
    assert category_for_status(409) is Category.NETWORK_TIMEOUT
