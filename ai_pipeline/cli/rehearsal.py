"""The rehearsal servers in the foreground: ``simulate-llm`` and ``receive-webhooks``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ai_pipeline.cli.common import EXIT_OK, UsageError


def cmd_simulate_llm(args: argparse.Namespace) -> int:
    from ai_pipeline.rehearsal.faults import FaultRule, SimulatorConfig
    from ai_pipeline.rehearsal.simulator import serve

    faults = []
    if args.faults:
        try:
            raw = json.loads(Path(args.faults).read_text("utf-8"))
            faults = [FaultRule.model_validate(f) for f in raw.get("faults", raw)]
        except (OSError, ValueError) as e:
            raise UsageError(f"--faults {args.faults}: {e}") from e
    models = None
    if args.models is not None:
        models = tuple(name.strip() for name in args.models.split(",") if name.strip())
        if not models:
            raise UsageError("--models: give at least one model name, e.g. gpt-4o-mini,o4-mini")
    config = SimulatorConfig(
        latency_ms=args.latency_ms,
        max_concurrency=args.max_concurrency,
        api_keys=set(args.api_key) if args.api_key else None,
        faults=faults,
        served_model_suffix=args.served_model_suffix,
        openai_rules=args.openai_rules,
        models=models,
        prompt_caching=True if args.prompt_caching else None,
        batch_seconds=args.batch_seconds,
        batch_window_seconds=args.batch_window_seconds,
        batch_cancel_seconds=args.batch_cancel_seconds,
    )
    serve(config, host=args.host, port=args.port)
    return EXIT_OK


def cmd_receive_webhooks(args: argparse.Namespace) -> int:
    from ai_pipeline.rehearsal.receiver import serve
    from ai_pipeline.rehearsal.receiver_state import ReceiverConfig

    serve(ReceiverConfig(state_file=args.state_file), host=args.host, port=args.port)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "simulate-llm",
        help="run the OpenAI-compatible simulator in the foreground",
        description="An OpenAI-compatible server (/v1/chat/completions, /v1/models, the Batch "
        "API's /v1/files and /v1/batches) that answers with a deterministic analysis of the text it is sent, counts requests per "
        "Idempotency-Key (GET /_sim/stats) and injects faults on demand (POST /_sim/faults).",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument("--port", type=int, default=8765, help="port (default: %(default)s)")
    p.add_argument("--latency-ms", type=int, default=0, help="latency per request (default: 0)")
    p.add_argument(
        "--max-concurrency", type=int, default=64, help="requests served at once (default: 64)"
    )
    p.add_argument(
        "--api-key", action="append", help="accept only this key (repeatable; default: any)"
    )
    p.add_argument("--faults", help='JSON file with fault rules ({"faults": [...]})')
    p.add_argument(
        "--served-model-suffix",
        default="",
        help="answer under the requested model name plus this, as OpenAI answers gpt-4o-mini as "
        "gpt-4o-mini-2024-07-18 (default: the name requested)",
    )
    p.add_argument(
        "--openai-rules",
        action="store_true",
        help="refuse what OpenAI refuses, with its status codes and error bodies (reasoning-model "
        "parameters, unknown models, JSON mode without 'json', non-strict schemas, n>1); report "
        "reasoning and cached tokens in usage",
    )
    p.add_argument(
        "--models",
        help="comma-separated model names served; others get 404 model_not_found (default: any "
        "name; with --openai-rules gpt-4o-mini,gpt-4o,gpt-4.1-mini,gpt-5-mini,o4-mini and "
        "sim-analyst-1)",
    )
    p.add_argument(
        "--prompt-caching",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens as OpenAI's prompt caching would "
        "(on with --openai-rules)",
    )
    p.add_argument(
        "--batch-seconds",
        type=float,
        default=0.0,
        help="Batch API: seconds from creating a batch to its completion (default: 0)",
    )
    p.add_argument(
        "--batch-window-seconds",
        type=float,
        default=None,
        help="Batch API: a batch not done within this many seconds expires, its unfinished "
        "lines batch_expired (default: never)",
    )
    p.add_argument(
        "--batch-cancel-seconds",
        type=float,
        default=0.0,
        help="Batch API: seconds a cancelled batch stays cancelling (default: 0)",
    )
    p.set_defaults(func=cmd_simulate_llm)

    p = sub.add_parser(
        "receive-webhooks",
        help="run the reference idempotent webhook receiver in the foreground",
        description="A downstream that implements idempotency: the first notice under an "
        "Idempotency-Key gets 201, the same key again 409. For rehearsals of exactly-once "
        "notifications (point AI_PIPELINE_WEBHOOK_URL at http://HOST:PORT/notices).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8766, help="port (default: %(default)s)")
    p.add_argument("--state-file", help="SQLite file that keeps accepted keys across restarts")
    p.set_defaults(func=cmd_receive_webhooks)
