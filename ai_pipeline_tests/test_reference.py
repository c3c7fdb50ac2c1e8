"""The documents that describe the code agree with it: the generated reference pages, the README's
links and test command, and what a checkout keeps out of git."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from ai_pipeline.cli import build_parser
from ai_pipeline.cli.reference import PAGES, cli_reference, failure_table
from ai_pipeline.failures import RULES
from ai_pipeline_tests.support import REPO

DOCS = REPO / "docs"


def all_parsers() -> list[argparse.ArgumentParser]:
    """The parser of ``ai-pipeline`` and every parser below it."""
    found, todo = [], [build_parser()]
    while todo:
        parser = todo.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


@pytest.mark.parametrize("name", sorted(PAGES))
def test_committed_reference_pages_are_what_the_code_renders(name: str) -> None:
    """docs/cli.md and docs/failures.md are exactly what the parsers and RULES render now."""
    committed = (DOCS / name).read_text(encoding="utf-8")
    assert committed == PAGES[name](), (
        f"docs/{name} is stale: run `python -m ai_pipeline.cli.reference docs`"
    )


def test_the_cli_reference_names_every_flag_of_every_command() -> None:
    """Every option string of every parser and subparser appears in the rendered reference."""
    reference = cli_reference()
    flags = {
        option
        for parser in all_parsers()
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    }
    assert flags, "no flags found"
    assert sorted(f for f in flags if f"`{f}" not in reference) == []


def test_the_failure_table_has_one_row_per_category_in_rules_order() -> None:
    """The rendered table lists every category of RULES once, in RULES' order, with its layer."""
    rows = [line for line in failure_table().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [c.value for c in RULES]
    assert all(f"| {RULES[c].layer.value} |" in row for c, row in zip(RULES, rows, strict=True))


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    """Each relative link of the README and of docs/ names a file of the checkout."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert missing == []


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    """CI (.ci/run) runs the README's test command character for character."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    command = next(line for line in ci if line.startswith("python3 -m venv .venv &&"))
    assert f"\n{command}\n" in (REPO / "README.md").read_text(encoding="utf-8")


# Commands that serve until stopped: pasted in the foreground, nothing after them would run.
SERVERS = ("dagster dev", "dagster-daemon", "simulate-llm", "ai-pipeline serve", "receive-webhooks")


def walkthrough_blocks() -> list[list[str]]:
    """The shell blocks of the README's walkthrough, each as its lines."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Watching it in the Dagster UI", 1)[1].split("\n## ", 1)[0]
    return [block.strip().splitlines() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_walkthrough_runs_a_server_in_the_foreground_only_last() -> None:
    """Pasted block by block, each of the README's walkthrough blocks runs to its end: a command
    that serves until stopped is either sent to the background or the block's last line."""
    blocks = walkthrough_blocks()
    assert len(blocks) == 2, "one block per terminal"
    blocking = [
        line
        for block in blocks
        for line in block[:-1]
        if any(server in line for server in SERVERS)
        and not line.split("#")[0].rstrip().endswith("&")
    ]
    assert blocking == []


# What the README's walkthrough, the demo and the product write into a checkout used as DAGSTER_HOME.
WRITTEN_INTO_A_CHECKOUT = [
    "tenants.yaml",
    "inbox/memo.txt",
    "reports/failure_report.png",
    "storage/runs.db",
    "history/runs/index.db",
    "schedules/schedules.db",
    "logs/event.log",
    ".logs_queue/x",
    ".nux/nux.yaml",
    ".telemetry/id.yaml",
    "ai_pipeline.sqlite",
    "ai_pipeline.sqlite-wal",
    "ai_pipeline.contract_review.sqlite",
    ".ai_pipeline.lock",
]


def test_what_a_walkthrough_writes_into_the_checkout_is_ignored_by_git() -> None:
    """git ignores every file the walkthrough, the demo and the product create in a checkout."""
    result = subprocess.run(
        [
            "git",
            "check-ignore",
            "--no-index",
            "--verbose",
            "--non-matching",
            *WRITTEN_INTO_A_CHECKOUT,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    not_ignored = [
        line.split("\t")[1] for line in result.stdout.splitlines() if line.startswith("::")
    ]
    assert not_ignored == []
