"""``ai-pipeline serve``: the submission service (HTTP API and its event streams) in the foreground."""

from __future__ import annotations

import argparse
from typing import Any

from ai_pipeline.cli.common import EXIT_OK

GRACEFUL_SHUTDOWN_SECONDS = 5


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ai_pipeline.defs.location import OWN, load_definitions
    from ai_pipeline.defs.site import settings_by_analysis
    from ai_pipeline.service.app import HEARTBEAT_SECONDS, create_app
    from ai_pipeline.settings import Settings

    overrides = {"tenants_file": args.tenants_file, "public_url": args.public_url}
    heartbeat = HEARTBEAT_SECONDS if args.heartbeat_seconds is None else args.heartbeat_seconds
    settings = Settings.load(**overrides)
    analyses = settings_by_analysis(load_definitions(settings.definitions or OWN))
    # A project's location: --analysis is the default one of its analyses. The product's own
    # holds one, the analysis --analysis (or AI_PIPELINE_ANALYSIS) names.
    default = args.analysis if settings.definitions else None
    app = create_app(
        settings, heartbeat_seconds=heartbeat, analyses=analyses, default_analysis=default
    )
    # Open event streams would hold a graceful shutdown for ever: they get a few seconds.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the submission API (submit over HTTP, follow over SSE)",
        description="The submission service: POST /api/v1/tasks answers 202 with a task id; GET "
        "/api/v1/tasks/{id} and its /events stream follow it; the work runs as Dagster runs "
        "(launched by the submissions sensor of a running dagster-daemon or `dagster dev`). "
        "It serves every analysis of the code location (AI_PIPELINE_DEFINITIONS): a submission "
        "names its analysis (`analysis`), else it goes to the one --analysis names, else to the "
        "first. Tenants and keys come from AI_PIPELINE_TENANTS_FILE; the OpenAPI is at /docs.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument("--port", type=int, default=8080, help="port (default: %(default)s)")
    p.add_argument(
        "--tenants-file", help="tenants and API keys (default: AI_PIPELINE_TENANTS_FILE)"
    )
    p.add_argument(
        "--public-url",
        help="where clients reach the service, e.g. https://pipeline.example.com (the URLs it "
        "hands out start with it; default: AI_PIPELINE_PUBLIC_URL, else paths)",
    )
    p.add_argument(
        "--heartbeat-seconds",
        type=_positive_seconds,
        help="seconds between the heartbeat comments of an event stream (default: 10)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: %(default)s)",
    )
    # It serves every analysis: --analysis only names the default one.
    p.set_defaults(func=cmd_serve, every_analysis=True)


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {value}")
    return seconds
