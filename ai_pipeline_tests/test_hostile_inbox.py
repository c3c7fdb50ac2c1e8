"""The inbox as hostile input: a corpus of more than thirty kinds of bad or odd entries beside good
documents. No crash, no hang, the good ones complete, every bad one has a reason naming it, and
nothing outside the inbox is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from ai_pipeline.documents import display_path
from ai_pipeline.inbox import list_files, scan_inbox
from ai_pipeline_tests import hostile
from ai_pipeline_tests.support import REPO, results_store


@pytest.fixture
def corpus(tmp_path: Path) -> Iterator[hostile.Corpus]:
    c = hostile.build(tmp_path)
    time.sleep(1.2)  # older than the settle time of 1 s: all but the file written next
    c.write_fresh()
    yield c
    c.close()


def _name(corpus: hostile.Corpus, path: str) -> str:
    return os.path.relpath(path, corpus.inbox)


def test_the_corpus_is_large_enough() -> None:
    """The corpus holds at least thirty kinds of bad or odd entries."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        c = hostile.build(Path(tmp))
        try:
            odd = [k for k, v in c.entries.items() if v.outcome != "complete"]
            odd += ["-rf.txt", "two\nlines.txt", "link-inside-file.txt", "looks-like-a-file.txt"]
            assert len(odd) >= 30
        finally:
            c.close()


def test_listing_classifies_every_entry(corpus: hostile.Corpus) -> None:
    """list_files returns every good and rejectable file, skips the rest with its reason, and
    leaves the file being written for later: each entry is accounted for exactly once."""
    started = time.monotonic()
    listing = list_files([corpus.inbox], settle_seconds=1.0)
    assert time.monotonic() - started < 5, "no entry makes the listing wait"

    files = {_name(corpus, display_path(p)) for p in listing.files}
    assert files == {k for k, v in corpus.entries.items() if v.outcome in ("complete", "reject")}
    skipped = {_name(corpus, s.path): s.reason for s in listing.skipped}
    for name, expect in corpus.of("skip").items():
        assert expect.reason in skipped.get(name, ""), (name, skipped)
    assert set(skipped) == set(corpus.of("skip"))
    assert [p.name for p in listing.settling] == ["being-written.txt"]


def test_a_sensor_scan_reports_each_skipped_entry_once(corpus: hostile.Corpus) -> None:
    """The inbox scan gives the same verdicts, and its cursor reports nothing a second time."""
    first = scan_inbox(corpus.inbox, settle_seconds=1.0)
    assert {_name(corpus, s.path) for s in first.skipped} == set(corpus.of("skip"))
    assert all(str(corpus.outside) not in os.fsdecode(p) for p in first.paths)
    second = scan_inbox(corpus.inbox, first.cursor, settle_seconds=0)
    assert [p.name for p in second.paths] == ["being-written.txt"]
    assert second.skipped == []


@pytest.mark.slow
def test_a_run_over_the_corpus_completes_the_good_and_names_every_bad(
    corpus: hostile.Corpus, dagster_home: Path, simulator, instance: dg.DagsterInstance
) -> None:
    """``ai-pipeline run`` (a real process) over the corpus: no crash or hang, the good documents
    complete, every rejected file fails INPUT_QUALITY_ISSUE with a reason naming it, every
    skipped entry is listed with its reason, and nothing outside the inbox reaches the model."""
    env = os.environ | {
        "AI_PIPELINE_MAX_DOCUMENT_BYTES": str(hostile.MAX_BYTES),
        "AI_PIPELINE_SETTLE_SECONDS": "1",
    }
    writing = threading.Event()

    def keep_writing() -> None:
        # A file still being written while the run looks: it must be left for the next run.
        with open(corpus.inbox / "being-written.txt", "a", encoding="utf-8") as f:
            while not writing.wait(0.2):
                f.write("more of a long upload\n")
                f.flush()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "ai_pipeline.cli",
                "run",
                "--inbox",
                str(corpus.inbox),
                "--json",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        writing.set()
        writer.join()
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)

    by_source: dict[str, dict] = {}
    for doc in report["documents"]:
        for source in doc["sources"]:
            by_source[_name(corpus, source)] = doc
    for name in corpus.of("complete"):
        assert by_source[name]["state"] == "COMPLETED", (name, by_source.get(name))
    assert by_source["link-inside-file.txt"] is by_source["good-1.txt"], "an alias"
    rejected = corpus.of("reject")
    for name, expect in rejected.items():
        doc = by_source[name]
        assert (doc["state"], doc["category"]) == ("FAILED", "INPUT_QUALITY_ISSUE"), name
        assert expect.reason in doc["error"] and name in doc["error"], (name, doc["error"])
        assert doc["sources"] == [doc["source"]], f"{name} is no alias of another bad file"
    skipped = {_name(corpus, s["path"]): s["reason"] for s in report["skipped"]}
    assert set(skipped) == set(corpus.of("skip"))
    assert [Path(p).name for p in report["settling"]] == ["being-written.txt"]

    good_documents = {by_source[n]["document_id"] for n in corpus.of("complete")}
    assert simulator.stats()["total"] == len(good_documents)
    store = results_store()
    texts = [store.documents.load(d["document_id"]).text or "" for d in report["documents"]]  # type: ignore[union-attr]
    assert not any(hostile.SECRET in t for t in texts), "nothing outside the inbox was read"
    assert len(report["documents"]) == len(good_documents) + len(rejected)
