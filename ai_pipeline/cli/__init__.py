"""``ai-pipeline``: run, watch and rehearse the pipeline from a terminal.

Commands are thin — parse, call one function of the application layer, print — one module per
group: ``process`` (demo, run, status), ``backfill`` (backfill, requeue), ``review``, ``batches``
(submit, batch, report), ``openai_batches`` (batch-api: OpenAI's Batch API), ``serve`` (the submission service), ``rehearsal`` (simulate-llm, receive-webhooks). Commands that process
documents go through Dagster against the project's instance (``DAGSTER_HOME``), so what they do
shows in the Dagster UI exactly like a sensor's runs.

Exit codes: 0 success, 1 some documents failed, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ai_pipeline.cli import (
    backfill,
    batches,
    canary,
    openai_batches,
    process,
    rehearsal,
    review,
    serve,
)
from ai_pipeline.cli.common import EXIT_USAGE
from ai_pipeline.cli.library_logs import plainly
from ai_pipeline.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ai-pipeline",
        description="Idempotent, retry-safe LLM analysis of document collections on Dagster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (process, backfill, canary, review, batches, openai_batches, serve):
        group.add_commands(sub)
    # Every command of the pipeline works on one analysis; the rehearsal tools on none.
    for command in sub.choices.values():
        command.add_argument(
            "--analysis",
            metavar="NAME",
            help="the analysis to work on: a built-in's name (document_analysis, "
            "contract_review) or a Declaration's import path; with AI_PIPELINE_DEFINITIONS, "
            "the name of one of the project's analyses (its component's name:) (default: "
            "AI_PIPELINE_ANALYSIS, else document_analysis; the project's first)",
        )
    rehearsal.add_commands(sub)
    return parser


@contextmanager
def _analysis(name: str | None, every: bool = False) -> Iterator[None]:
    """The analysis a command works on, as the settings it fixes, for this command only.

    With ``AI_PIPELINE_DEFINITIONS`` (a project's code location) the analysis is one of that
    location's — ``--analysis`` names it, else the first — and its own settings (its results
    database, its inbox) are the command's; a command that works on ``every`` analysis of the
    location (``serve``) is only checked to name one of them: each analysis's settings are its
    own there. Otherwise ``--analysis`` overrides ``AI_PIPELINE_ANALYSIS``.
    """
    from ai_pipeline.declaration import DeclarationError

    location = os.environ.get("AI_PIPELINE_DEFINITIONS")
    if name is None and not location:
        yield
        return
    try:
        fixed = {"AI_PIPELINE_ANALYSIS": name}
        if location:
            from ai_pipeline.defs.site import site_named

            site = site_named(_loaded(location), name)
            if every:
                yield
                return
            _say_whose_model(site.declaration)
            fixed = {
                "AI_PIPELINE_ANALYSIS": site.declaration.name,
                "AI_PIPELINE_DATABASE_URL": site.database_url,
                "AI_PIPELINE_INBOX": site.inbox,
            }
        else:
            from ai_pipeline.analyses import resolve

            resolve(str(name))
    except DeclarationError as e:  # the project's declaration names its file; a flag's, the flag
        raise InputError(str(e) if location else f"--analysis: {e}") from None
    before = {k: os.environ.get(k) for k in fixed}
    os.environ.update({k: v for k, v in fixed.items() if v is not None})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _say_whose_model(declaration: Any) -> None:
    """One line when the environment names another model than the project's analysis declares:
    the declaration's is used (its task ids, what is stale)."""
    declared = declaration.model.name
    wanted = os.environ.get("AI_PIPELINE_MODEL")
    if declared and wanted and wanted != declared:
        print(
            f"ai-pipeline: AI_PIPELINE_MODEL={wanted} is not the model analysis "
            f"{declaration.name!r} declares ({declared}, its llm.name): {declared} is used",
            file=sys.stderr,
        )


def _loaded(location: str) -> Any:
    """The project's code location, or one line saying why it does not load: the declaration's
    error as the file has it (a component wraps it in Dagster's tree of the defs folder)."""
    from ai_pipeline.declaration import DeclarationError
    from ai_pipeline.defs.location import load_definitions

    try:
        return load_definitions(location)
    except (InputError, DeclarationError):
        raise
    except Exception as e:
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, DeclarationError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise InputError(
            f"AI_PIPELINE_DEFINITIONS={location}: {first} (`dg check defs` shows where)"
        ) from None


def _project_env() -> None:
    """The project's ``.env`` (the current folder's, else the nearest up to the folder holding
    its ``pyproject.toml``), loaded as ``dg dev`` and Dagster's daemon load theirs: its values win
    over the shell's, so every command reads the instance and the code location they do. A shell
    value it replaces is said in one line."""
    from dotenv import dotenv_values

    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / ".env").is_file():
            for key, value in dotenv_values(folder / ".env").items():
                if value is None:
                    continue
                before = os.environ.get(key)
                if before is not None and before != value:
                    print(
                        f"ai-pipeline: {key} is {folder / '.env'}'s, as for dg dev (not the "
                        "shell's)",
                        file=sys.stderr,
                    )
                os.environ[key] = value
            return
        if (folder / "pyproject.toml").is_file():
            return


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _project_env()
    try:
        with (
            plainly(),
            _analysis(getattr(args, "analysis", None), getattr(args, "every_analysis", False)),
        ):
            return int(args.func(args))
    except InputError as e:  # usage, configuration, a request that does not fit: one line
        print(f"ai-pipeline: error: {e}", file=sys.stderr)
        return EXIT_USAGE
