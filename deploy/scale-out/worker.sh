#!/bin/sh
# One worker host: runs of the queue `dagster`, AI_PIPELINE_WORKER_RUNS at a time (default 4).
# Needs on PATH the virtual environment where ai-pipeline[scale] is installed (dagster-celery runs
# `celery` from PATH), DAGSTER_HOME with deploy/scale-out/dagster.yaml, and the environment listed
# there and in docs/configuration.md (results database, LLM endpoint and key).
# The worker's node name is $AI_PIPELINE_WORKER_NAME@<host name>. Drain the host with
#   celery -A dagster_celery.app -b "$AI_PIPELINE_CELERY_BROKER" control shutdown -d ai-pipeline@HOST
# (Celery's warm shutdown, sent over the broker: no new run is taken, running ones finish; the
# command exits 69, "No nodes replied", as a shutdown sends no reply). `dagster-celery worker
# terminate -y celery.yaml` cannot: it does not resolve the env: references. A SIGTERM to this
# script alone does not reach celery, which dagster-celery starts as its child.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec dagster-celery worker start -A dagster_celery.app -y "$here/celery.yaml" -q dagster \
    -n "${AI_PIPELINE_WORKER_NAME:-ai-pipeline}" -i ai_pipeline.defs.celery_worker -- \
    --concurrency="${AI_PIPELINE_WORKER_RUNS:-4}" --max-tasks-per-child="${AI_PIPELINE_WORKER_MAX_RUNS:-50}" "$@"
