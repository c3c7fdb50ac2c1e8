"""A big launch as several backfills: how documents are cut into parts, and what ``submit`` and
``backfill --failed`` make of them in a real Dagster instance (no daemon: the backfills stay
queued, which is what a re-submit must respect)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ai_pipeline.defs import chunks
from ai_pipeline.defs.chunks import (
    PART_TAG,
    Chunk,
    batch_part_backfill_id,
    split,
)
from ai_pipeline.defs.dagster_private import BulkActionStatus
from ai_pipeline.defs.site import DEFAULT_SITE
from ai_pipeline.failures import Category
from ai_pipeline.intake import BATCH_TAG
from ai_pipeline.states import State
from ai_pipeline_tests.defs.test_backfills import covered_by, daemon_env  # noqa: F401 (a fixture)
from ai_pipeline_tests.support import launcher, make_inbox, run_cli, sample_text


@pytest.mark.parametrize(
    ("documents", "most", "sizes"),
    [
        (100_000, 10_000, [10_000] * 10),
        (10_001, 10_000, [5001, 5000]),
        (10_000, 10_000, [10_000]),
        (7, 3, [3, 2, 2]),
        (1, 10_000, [1]),
        (0, 10_000, []),
    ],
)
def test_split_cuts_every_document_into_exactly_one_part_of_equal_size(
    documents: int, most: int, sizes: list[int]
) -> None:
    """``split`` makes as few parts of at most ``most`` as can be, equal give or take one, in the
    documents' order, each document in exactly one part."""
    ids = [f"{i:016x}" for i in range(documents)]
    parts = split(ids, most)
    assert [len(c.document_ids) for c in parts] == sizes
    assert [d for c in parts for d in c.document_ids] == ids
    assert [(c.part, c.parts) for c in parts] == [(i + 1, len(sizes)) for i in range(len(sizes))]


def test_titles_name_the_part_only_when_there_are_several() -> None:
    """One part keeps the launch's title; several say which part each is."""
    assert Chunk(1, 1, ("a",)).title("batch weekly") == "batch weekly"
    assert Chunk(3, 10, ("a",)).title("batch weekly") == "batch weekly, part 3/10"


def test_a_parts_backfill_id_is_deterministic_and_new_for_each_launch_of_it() -> None:
    """The id depends only on the batch, the part and how many backfills the part had before."""
    part = Chunk(2, 3, ("a", "b"))
    same = batch_part_backfill_id(DEFAULT_SITE, "b1", part, 0)
    assert same == batch_part_backfill_id(DEFAULT_SITE, "b1", Chunk(2, 3, ("c",)), 0)
    others = {
        batch_part_backfill_id(DEFAULT_SITE, "b1", part, 1),
        batch_part_backfill_id(DEFAULT_SITE, "b2", part, 0),
        batch_part_backfill_id(DEFAULT_SITE, "b1", Chunk(1, 3, ("a",)), 0),
    }
    assert same not in others and len(others) == 3


def targeted(backfill: Any) -> set[str]:
    """The documents a backfill targets (its partitions of the analysis' results asset)."""
    subset = backfill.asset_backfill_data.target_subset
    return set(subset.get_partitions_subset(DEFAULT_SITE.results_key).get_partition_keys())


def batch_backfills(instance: dg.DagsterInstance) -> dict[str, Any]:
    return {b.tags[PART_TAG]: b for b in instance.get_backfills()}


def submit(capsys: pytest.CaptureFixture[str], inbox: Path) -> dict[str, Any]:
    code, out = run_cli(capsys, "submit", str(inbox), "--batch", "weekly", "--json")
    assert code == 0
    return out


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Seven documents, in backfills of at most three."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_DOCUMENTS", "3")
    return make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(i) for i in range(7)})


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the launch, not the storage
def test_submit_launches_a_big_batch_as_parts_and_a_resubmission_launches_nothing(
    instance: dg.DagsterInstance, inbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seven documents at three a backfill: three backfills titled by part, with their
    deterministic ids, each document in exactly one; submitting again while they are queued
    launches nothing and names all three; ``batch`` lists them with their status."""
    first = submit(capsys, inbox)

    found = batch_backfills(instance)
    assert sorted(found) == ["1/3", "2/3", "3/3"]
    assert [b["backfill_id"] for b in first["backfills"]] == first["backfill_ids"]
    assert set(first["backfill_ids"]) == {b.backfill_id for b in found.values()}
    assert first["backfill_id"] == found["1/3"].backfill_id
    assert [b["documents"] for b in first["backfills"]] == [3, 2, 2]
    ids = instance.get_dynamic_partitions(DEFAULT_SITE.partitions)
    for label, backfill in found.items():
        assert backfill.title == f"batch weekly, part {label}"
        assert backfill.tags[BATCH_TAG] == first["batch_id"]
        part = Chunk(int(label[0]), 3, ())
        assert backfill.backfill_id == batch_part_backfill_id(
            DEFAULT_SITE, first["batch_id"], part, 0
        )
    everyone = [d for b in found.values() for d in targeted(b)]
    assert sorted(everyone) == sorted(ids) and len(everyone) == 7

    again = submit(capsys, inbox)

    assert again["already_running"] is True
    assert again["backfill_ids"] == first["backfill_ids"]
    assert len(instance.get_backfills()) == 3
    code, batch = run_cli(capsys, "batch", first["batch_id"], "--json")
    assert code == 0
    assert [(b["backfill_id"], b["title"], b["status"]) for b in batch["backfills"]] == [
        (found[p].backfill_id, f"batch weekly, part {p}", "REQUESTED")
        for p in ("1/3", "2/3", "3/3")
    ]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_resubmission_relaunches_only_the_part_whose_backfill_is_over(
    instance: dg.DagsterInstance, inbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Part 2's backfill canceled, the others queued: submitting again launches one backfill,
    for part 2, under the part's next id, and names the other two as still running."""
    first = submit(capsys, inbox)
    part2 = batch_backfills(instance)["2/3"]
    instance.update_backfill(part2.with_status(BulkActionStatus.CANCELED))

    again = submit(capsys, inbox)

    assert again["already_running"] is False
    launched = [b for b in again["backfills"] if b["launched"]]
    assert [b["part"] for b in launched] == ["2/3"]
    expected = batch_part_backfill_id(DEFAULT_SITE, first["batch_id"], Chunk(2, 3, ()), 1)
    assert launched[0]["backfill_id"] == expected
    assert sorted(again["backfill_ids"]) == sorted(
        [first["backfill_ids"][0], expected, first["backfill_ids"][2]]
    )
    assert len(instance.get_backfills()) == 4
    relaunched = instance.get_backfill(expected)
    assert relaunched is not None and targeted(relaunched) == targeted(part2)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_submit_stopped_half_way_is_completed_by_the_next_without_duplicates(
    instance: dg.DagsterInstance,
    inbox: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A submit that dies after launching its first part's backfill: the next one launches parts
    two and three under the ids the first would have given them, and leaves part one be."""
    launch = chunks.launch_backfill
    made: list[str] = []

    def dies_after_one(*args: Any, **kwargs: Any) -> str:
        if made:
            raise RuntimeError("the process died")
        made.append(launch(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(chunks, "launch_backfill", dies_after_one)
    with pytest.raises(RuntimeError):
        submit(capsys, inbox)
    monkeypatch.setattr(chunks, "launch_backfill", launch)
    assert [b.backfill_id for b in instance.get_backfills()] == made

    again = submit(capsys, inbox)

    assert [(b["part"], b["launched"]) for b in again["backfills"]] == [
        ("1/3", False),
        ("2/3", True),
        ("3/3", True),
    ]
    assert again["backfill_ids"][0] == made[0]
    assert sorted(batch_backfills(instance)) == ["1/3", "2/3", "3/3"]


@pytest.mark.accelerated
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_parts_runs_are_sized_for_the_whole_launch(
    instance: dg.DagsterInstance,
    inbox: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run size is chosen once for all the parts, which share the run queue: seven documents
    over the four slots of ``max_concurrent_runs`` (at an LLM concurrency of one) are two a run
    in every part, not one (a part's three over four slots)."""
    monkeypatch.delenv("AI_PIPELINE_BACKFILL_RUN_SIZE", raising=False)
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", "1")
    submit(capsys, inbox)
    keys = instance.get_dynamic_partitions(DEFAULT_SITE.partitions)
    sizes = {
        label: [len(covered_by(r, keys)) for r in b.submitting_run_requests]
        for label, b in batch_backfills(instance).items()
    }
    assert sizes == {"1/3": [2, 1], "2/3": [2], "3/3": [2]}


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the wait knows no backend
@pytest.mark.usefixtures("daemon_env")
def test_submit_wait_waits_for_every_part(
    instance: dg.DagsterInstance,
    simulator: Any,
    daemon: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three documents at two a backfill, under a real daemon: ``submit --wait`` returns once
    both backfills' documents are done, with each one's status, and every document analysed once."""
    monkeypatch.setenv("AI_PIPELINE_BACKFILL_DOCUMENTS", "2")
    inbox = make_inbox(tmp_path / "inbox", {f"d{i}.txt": sample_text(800 + i) for i in range(3)})
    daemon.start()

    code, out = run_cli(
        capsys, "submit", str(inbox), "--batch", "two", "--wait", "--json", "--timeout", "240"
    )

    assert code == 0, out
    assert [(b["part"], b["documents"]) for b in out["backfills"]] == [("1/2", 2), ("2/2", 1)]
    assert out["statuses"] == {i: "COMPLETED_SUCCESS" for i in out["backfill_ids"]}
    assert out["status"] == "COMPLETED_SUCCESS"
    assert (out["total"], out["succeeded"], out["failed"], out["pending"]) == (3, 3, 0, 0)
    assert simulator.stats()["total"] == 3


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_backfill_failed_launches_many_failures_as_parts(
    instance: dg.DagsterInstance, inbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seven failed documents at three a backfill: ``backfill --failed`` launches three
    backfills titled by part, each document in exactly one, and names them all."""
    app = launcher(instance)
    ids = app.register_inbox(inbox).document_ids
    for d in ids:
        app.store.documents.transition(d, State.RUNNING, through=State.QUEUED)
        app.store.documents.transition(d, State.FAILED, category=Category.NETWORK_TIMEOUT)

    code, out = run_cli(capsys, "backfill", "--failed", "--json")

    assert code == 0
    assert [(b["part"], b["documents"], b["launched"]) for b in out["backfills"]] == [
        ("1/3", 3, True),
        ("2/3", 2, True),
        ("3/3", 2, True),
    ]
    found = batch_backfills(instance)
    assert {b.backfill_id for b in found.values()} == set(out["backfill_ids"])
    assert [found[p].title for p in ("1/3", "2/3", "3/3")] == [
        f"failed documents, part {p}" for p in ("1/3", "2/3", "3/3")
    ]
    everyone = [d for b in found.values() for d in targeted(b)]
    assert sorted(everyone) == sorted(ids)
