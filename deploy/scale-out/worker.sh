#!/bin/sh
# One worker host: runs of the queue `dagster`, AI_PIPELINE_WORKER_RUNS at a time (default 4).
# Needs on PATH the virtual environment where ai-pipeline[scale] is installed (dagster-celery runs
# `celery` from PATH), DAGSTER_HOME with deploy/scale-out/dagster.yaml, and the environment listed
# there and in docs/configuration.md (results database, LLM endpoint and key).
# SIGTERM drains the host: the worker takes no new run and exits when its runs have ended.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec dagster-celery worker start -A dagster_celery.app -y "$here/celery.yaml" -q dagster \
    -n "${AI_PIPELINE_WORKER_NAME:-ai-pipeline}" -i ai_pipeline.defs.celery_worker -- \
    --concurrency="${AI_PIPELINE_WORKER_RUNS:-4}" --max-tasks-per-child="${AI_PIPELINE_WORKER_MAX_RUNS:-50}" "$@"
