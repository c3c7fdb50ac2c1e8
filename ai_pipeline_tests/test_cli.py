"""The ``ai-pipeline`` command as a user runs it: a real process, real exit codes, real output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ai_pipeline.cli import build_parser, main
from ai_pipeline_tests.support import EXAMPLES, REPO, make_inbox, results_store, sample_text

COMMANDS = [
    "demo",
    "run",
    "status",
    "backfill",
    "canary",
    "requeue",
    "review",
    "review list",
    "review approve",
    "review reject",
    "submit",
    "batch",
    "report",
    "trace",
    "batch-api",
    "batch-api submit",
    "batch-api follow",
    "batch-api list",
    "batch-api show",
    "batch-api cancel",
    "serve",
    "simulate-llm",
    "receive-webhooks",
]


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ai_pipeline.cli", *args],
        cwd=cwd,
        env=env if env is not None else os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """Every command answers --help with a usage line and exit code 0."""
    with pytest.raises(SystemExit) as exited:
        main([*(command.split() if command else []), "--help"])
    assert exited.value.code == 0
    assert "usage: ai-pipeline" in capsys.readouterr().out


def test_the_installed_command_answers_help_at_once() -> None:
    """The ``ai-pipeline`` console script answers --help in a separate process, quickly (the
    parser imports neither Dagster nor the store)."""
    started = time.monotonic()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("ai-pipeline")), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: ai-pipeline" in result.stdout
    assert time.monotonic() - started < 20


def test_every_command_is_in_the_help_test() -> None:
    """The --help test covers every command the parser has (a new command is not forgotten)."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) == {c.split()[0] for c in COMMANDS}  # type: ignore[union-attr]


@pytest.mark.smoke
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the demo is the embedded default
def test_demo_twice(dagster_home: Path) -> None:
    """The demo completes every sample with one row each, one LLM call per section (a sample
    over the section budget is analysed in sections); a second demo makes no LLM call."""
    from ai_pipeline.declaration import DEFAULT_SECTION_CHARS, split_sections
    from ai_pipeline.documents import read_document

    samples = sorted(p for p in (EXAMPLES / "inbox").iterdir() if not p.name.startswith("."))
    sections = [len(split_sections(read_document(p).text, DEFAULT_SECTION_CHARS)) for p in samples]
    assert max(sections) > 1, "a sample long enough for sections"
    first = cli("demo", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["counts"]["by_state"] == {"COMPLETED": len(samples)}
    assert report["llm_requests"] == sum(sections)
    assert results_store().results.count() == len(samples)

    second = cli("demo", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout)
    assert again["llm_requests"] == 0
    assert again["counts"]["by_state"] == {"COMPLETED": len(samples)}
    assert results_store().results.count() == len(samples)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_demo_of_contract_review_pays_per_clause_and_keeps_its_own_results(
    dagster_home: Path,
) -> None:
    """``demo --analysis contract_review`` analyses the sample contracts clause by clause (one
    call per clause and one report each), in a results database of its own; a second demo
    makes no call, and the other analysis's database is refused for it with one clear line."""
    from ai_pipeline.analyses import CONTRACT_REVIEW
    from ai_pipeline.documents import read_document

    samples = sorted((EXAMPLES / "contract_review").iterdir())
    calls = sum(len(CONTRACT_REVIEW.cut(read_document(p).text)) + 1 for p in samples)
    first = cli("demo", "--analysis", "contract_review", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["counts"]["by_state"] == {"COMPLETED": len(samples)}
    assert report["llm_requests"] == calls
    assert {d["output"]["overall_risk"] for d in report["documents"]} <= {"high", "medium", "low"}
    assert (dagster_home / "ai_pipeline.contract_review.sqlite").exists()

    again = cli("demo", "--analysis", "contract_review", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["llm_requests"] == 0

    shared = {**os.environ, "AI_PIPELINE_DATABASE_URL": f"sqlite:///{dagster_home / 'x.sqlite'}"}
    assert cli("status", env=shared).returncode == 0  # the database now holds document_analysis
    refused = cli("status", "--analysis", "contract_review", env=shared)
    assert refused.returncode == 2
    assert "holds the results of the analysis 'document_analysis'" in refused.stderr
    assert refused.stderr.count("\n") == 1


@pytest.mark.slow
def test_run_reports_failures_with_exit_code_1(
    dagster_home: Path, simulator, tmp_path: Path
) -> None:
    """Bad files fail with INPUT_QUALITY_ISSUE naming the file, the rest complete, exit code 1."""
    inbox = make_inbox(
        tmp_path / "inbox",
        {"good-1.txt": sample_text(1), "good-2.md": sample_text(2), "empty.txt": b""},
    )
    (inbox / "garbage.txt").write_bytes((EXAMPLES / "bad" / "binary-garbage.txt").read_bytes())
    (inbox / "sheet.xlsx").write_bytes(b"PK\x03\x04 not a document")

    result = cli("run", "--inbox", str(inbox))

    assert result.returncode == 1, result.stderr[-3000:]
    out = result.stdout
    assert "5 documents: COMPLETED 2, FAILED 3" in out
    assert "INPUT_QUALITY_ISSUE 3" in out
    for name, reason in [
        ("empty.txt", "the file is empty"),
        ("garbage.txt", "not valid UTF-8"),
        ("sheet.xlsx", "unsupported file type"),
    ]:
        assert any(
            line.strip().startswith(d_id) and name in line and reason in line
            for line in out.split("why:")[1].splitlines()
            for d_id in [line.strip()[:20]]
        ), (name, out)
    assert simulator.stats()["total"] == 2, "bad input never reaches the LLM"

    status = cli("status", "--json")
    assert status.returncode == 0
    documents = json.loads(status.stdout)["documents"]
    failed = {Path(d["source"]).name: d for d in documents if d["state"] == "FAILED"}
    assert set(failed) == {"empty.txt", "garbage.txt", "sheet.xlsx"}
    assert all(d["category"] == "INPUT_QUALITY_ISSUE" for d in failed.values())
    assert all(str(inbox) in d["error"] for d in failed.values())


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # usage errors know no backend
def test_run_usage_errors_exit_2(dagster_home: Path, tmp_path: Path) -> None:
    """A missing inbox, a missing API key or a bad setting is a usage error with exit code 2."""
    env = os.environ.copy()
    env["OPENAI_API_KEY"] = "k"
    missing = cli("run", "--inbox", str(tmp_path / "nope"), env=env)
    assert missing.returncode == 2
    assert "is not a directory" in missing.stderr

    env.pop("OPENAI_API_KEY")
    no_key = cli("run", "--inbox", str(tmp_path), env=env)
    assert no_key.returncode == 2
    assert "OPENAI_API_KEY" in no_key.stderr

    env["OPENAI_API_KEY"] = "k"
    env["AI_PIPELINE_DOCUMENTS_PER_RUN"] = "many"
    bad_setting = cli("run", "--inbox", str(tmp_path), env=env)
    assert bad_setting.returncode == 2
    assert "AI_PIPELINE_DOCUMENTS_PER_RUN" in bad_setting.stderr

    unset_home = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    no_home = cli("status", env=unset_home, cwd=tmp_path)
    assert no_home.returncode == 2
    assert "DAGSTER_HOME" in no_home.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_api_key_never_in_output_or_metadata(
    dagster_home: Path, simulator, tmp_path: Path, instance
) -> None:
    """The API key appears in no CLI output, run tag, run config or event of the run."""
    from ai_pipeline_tests.support import TEST_API_KEY

    inbox = make_inbox(tmp_path / "inbox", {"a.txt": sample_text(1), "empty.txt": b""})
    result = cli("run", "--inbox", str(inbox), "--json", "--verbose")
    assert result.returncode == 1
    assert TEST_API_KEY not in result.stdout + result.stderr
    runs = instance.get_runs()
    assert runs
    for run in runs:
        assert TEST_API_KEY not in json.dumps(run.tags) + json.dumps(run.run_config, default=str)
        for record in instance.all_logs(run.run_id):
            assert TEST_API_KEY not in str(record)


@pytest.mark.slow
@pytest.mark.fresh_instance
def test_first_commands_at_once_on_a_fresh_instance(
    dagster_home: Path, simulator, tmp_path: Path
) -> None:
    """Three first commands at once on a fresh DAGSTER_HOME: none dies with a traceback (the
    first use is serialised), and the documents complete once."""
    inbox = make_inbox(tmp_path / "inbox", {"a.txt": sample_text(1), "b.txt": sample_text(2)})
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ai_pipeline.cli", *argv],
            cwd=REPO,
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in (
            ["run", "--inbox", str(inbox), "--json"],
            ["status"],
            ["run", "--inbox", str(inbox)],
        )
    ]
    outcomes = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in outcomes:
        assert "Traceback" not in err, err[-3000:]
        assert code == 0, err[-3000:]
    assert results_store().results.count() == 2
    assert simulator.stats()["total"] == 2
