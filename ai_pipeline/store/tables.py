"""The tables of the results database (SQLAlchemy Core), one ``MetaData`` for SQLite and PostgreSQL.

- ``documents``: one row per document id — state, category, attempts, last error, normalised text,
  and whether a reviewer rejected it.
- ``document_sources``: every file name a document arrived under (aliases of one content).
- ``checkpoints``: the stored result of one task (task id = document + step + prompt version +
  model); its existence means the task is done. First write wins.
- ``results``, ``results_history``: the analysis's output, one row per document, ever, and the
  rows re-analyses replaced; their columns follow the analysis (``results_tables``).
- ``failure_events``: every classification of a failure, appended, for reports.
- ``review_queue``: one item per document that needs a person, with a snapshot of its input.
- ``quarantine``: LLM outputs that failed grounding; kept for audit, never used as results.
- ``document_history``: what people and the pipeline did to a document (reviews, overrides,
  dead letter, requeue), appended.
- ``check_overrides``: stored outputs a reviewer accepted although a check failed.
- ``submitter_messages``: the outbox of messages to whoever submitted a rejected document.
- ``batches``: named sets of documents submitted together (the batch id is their content).
- ``store_info``: which analysis the database holds the results of (one per database).
- ``leases``: which run works on a task now, until when (one owner per task).
- ``llm_call_slots``: the places of the LLM calls in flight under the global cap
  (``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY``): one row per slot, held by one call until it is answered.
- ``tenant_tasks``, ``tenant_uploads``, ``tenant_requests``: tasks submitted over HTTP, whose each
  is, the original bytes of a submitted PDF, and each tenant's requests per minute.
- ``service_secrets``: secrets every process of a deployment shares (the review forms' signing key).
- ``replans``, ``replaced_documents``: the documents of a backfill whose runs Dagster planned, run
  instead in fewer runs (the documents of each new run), and which replan took each document.
- ``openai_batches``, ``openai_batch_lines``: jobs of OpenAI's Batch API (one per uploaded request
  file: our intent, its file, the remote batch, its status and counts) and each task a job carries
  (its line's state). Not to be confused with ``batches``, named sets of submitted documents.
"""

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()

# What the database is: the analysis whose results it holds (key "analysis").
store_info = sa.Table(
    "store_info",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

documents = sa.Table(
    "documents",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("size_bytes", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=True),
    sa.Column("rejected_reason", sa.Text, nullable=True),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("category", sa.String(32), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("status_message", sa.Text, nullable=True),
    # Set by a reviewer's rejection: the document is settled, never analysed again.
    sa.Column(
        "rejected_by_reviewer", sa.Boolean, nullable=False, default=False, server_default=sa.false()
    ),
    # How many sections a long document was cut into (its analysis calls); None: one call.
    sa.Column("sections", sa.Integer, nullable=True),
    # A submitter cancelled the task while a run held it: that run stops at its next step.
    sa.Column(
        "cancel_requested", sa.Boolean, nullable=False, default=False, server_default=sa.false()
    ),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

document_sources = sa.Table(
    "document_sources",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_document_sources_source", "source"),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("step", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


def _result_columns(fields: dict[str, sa.types.TypeEngine[Any]]) -> list[sa.Column[Any]]:
    """A document's output as stored: in results, and as kept in results_history. Its analysis's
    top-level fields are columns of their own (so SQL can query them on either backend), beside
    what every analysis records."""
    return [
        *(sa.Column(name, type_, nullable=True) for name, type_ in fields.items()),
        # A sectioned document's per-section outputs, in section order (None: one call).
        sa.Column("sections", sa.JSON, nullable=True),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("prompt_version", sa.String(64), nullable=False),
        sa.Column("sources", sa.JSON, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=True),
        sa.Column("completion_tokens", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    ]


RESULT_COLUMNS = frozenset(c.name for c in _result_columns({})) | {"document_id", "id"}


def results_tables(fields: dict[str, sa.types.TypeEngine[Any]]) -> tuple[sa.Table, sa.Table]:
    """``results`` (one row per document, ever) and ``results_history`` (the rows a re-analysis
    replaced — another task: a new version or model, a reviewer's retry — as they were), with a
    column for each of ``fields``, on a ``MetaData`` of their own."""
    own = sa.MetaData()
    results = sa.Table(
        "results",
        own,
        sa.Column("document_id", sa.String(64), primary_key=True),
        *_result_columns(fields),
    )
    history = sa.Table(
        "results_history",
        own,
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("document_id", sa.String(64), nullable=False, index=True),
        *_result_columns(fields),
        sa.Column("replaced_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replaced_by_task", sa.String(128), nullable=False),
    )
    return results, history


failure_events = sa.Table(
    "failure_events",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, index=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("layer", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
)

review_queue = sa.Table(
    "review_queue",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("snapshot", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("decision", sa.String(32), nullable=True),
    sa.Column("decided_by", sa.String(128), nullable=True),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

quarantine = sa.Table(
    "quarantine",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("output", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

history = sa.Table(
    "document_history",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("task_id", sa.String(128), nullable=True),
    sa.Column("event", sa.String(40), nullable=False),
    sa.Column("detail", sa.Text, nullable=True),
)

overrides = sa.Table(
    "check_overrides",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False),
    sa.Column("decided_by", sa.String(128), nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

outbox = sa.Table(
    "submitter_messages",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("message_zh", sa.Text, nullable=False),
    sa.Column("message_en", sa.Text, nullable=False),
)

batches = sa.Table(
    "batches",
    metadata,
    sa.Column("batch_id", sa.String(32), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("document_ids", sa.JSON, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

replans = sa.Table(
    "replans",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("backfill_id", sa.String(64), nullable=False, index=True),
    # The new runs' documents, one list per run, in partition order.
    sa.Column("runs", sa.JSON, nullable=False),
    # Whether each new run names its documents (else it covers its whole range).
    sa.Column("named", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# The documents of a backfill that a replan took: they run in its runs, and in no other of the
# backfill's (one row each, ever: two replans never take the same document).
replaced_documents = sa.Table(
    "replaced_documents",
    metadata,
    sa.Column("backfill_id", sa.String(64), primary_key=True),
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("replan", sa.Integer, nullable=False),
)

# The last sign of life of each run that works on documents, and its process: a run whose signs
# stopped is dead to Dagster's run monitoring (``ai_pipeline.defs.run_health``).
run_beats = sa.Table(
    "run_beats",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
    # The run worker's process (``ai_pipeline.processes``): one known dead is failed at once.
    sa.Column("process", sa.String(200), nullable=True),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("task_id", sa.String(128), primary_key=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("owner", sa.String(64), nullable=False, index=True),
    sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    # The owner's process (``ai_pipeline.processes``): one known dead is taken over before expiry.
    sa.Column("process", sa.String(200), nullable=True),
)

# One row per slot of the global cap on LLM calls in flight; a slot without a holder is free, and
# so is one whose holder's lease expired (``ai_pipeline.store.slots``).
llm_call_slots = sa.Table(
    "llm_call_slots",
    metadata,
    sa.Column("slot", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("holder", sa.String(64), nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    # The holder's process (``ai_pipeline.processes``): one known dead frees its slot at once.
    sa.Column("process", sa.String(200), nullable=True),
)

# Tasks submitted over HTTP (``ai-pipeline serve``): whose each one is. ``seq`` orders them for the
# submissions sensor's cursor; a tenant submitting the same content again finds its task.
tenant_tasks = sa.Table(
    "tenant_tasks",
    metadata,
    sa.Column("seq", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("task_id", sa.String(128), nullable=False, unique=True),
    sa.Column("tenant_id", sa.String(64), nullable=False, index=True),
    sa.Column("document_id", sa.String(64), nullable=False, unique=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# The original bytes of a binary file submitted over HTTP (a PDF): no file on disk holds it, and
# the review page renders its first page from here.
tenant_uploads = sa.Table(
    "tenant_uploads",
    metadata,
    sa.Column("document_id", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

# How many requests each tenant made in each clock minute (its per-minute limit), counted by one
# upsert per request so that every web process counts against the same limit.
tenant_requests = sa.Table(
    "tenant_requests",
    metadata,
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("minute", sa.BigInteger, primary_key=True),  # minutes since the epoch, UTC
    sa.Column("count", sa.Integer, nullable=False),
)

# Secrets that every web process on this database must share and that outlive a restart (the key
# that signs the review page's forms): the first process to need one creates it, the rest read it.
service_secrets = sa.Table(
    "service_secrets",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(128), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# Every LLM response that reported usage (and every request refused or lost, with none): what
# each attempt of each task cost, whatever became of its answer.
llm_usage = sa.Table(
    "llm_usage",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("task_id", sa.String(128), nullable=False, index=True),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("step", sa.String(32), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True, index=True),
    sa.Column("model", sa.String(128), nullable=False),
    # "answer" for a reply (whatever its checks then said), else the request's failure category.
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # As billed: the prompt tokens served from the endpoint's prompt cache (of prompt_tokens,
    # priced lower) and the reasoning tokens (of completion_tokens, unseen in the reply). NULL:
    # the endpoint did not say (or the row predates these columns).
    sa.Column("cached_tokens", sa.Integer, nullable=True),
    sa.Column("reasoning_tokens", sa.Integer, nullable=True),
    # How the request went: "sync" (a call) or "batch" (a line of an OpenAI Batch API job,
    # billed at the batch price). Rows from before the column say "sync".
    sa.Column("via", sa.String(8), nullable=False, server_default="sync"),
)

# Spending limits shared by every run that names them (``batch:<id>``, ``run:<id>``,
# ``launch:<id>``): a call reserves its estimate first, in one conditional UPDATE, and settles
# its real usage afterwards.
budgets = sa.Table(
    "budgets",
    metadata,
    sa.Column("key", sa.String(96), primary_key=True),
    sa.Column("limit_tokens", sa.Integer, nullable=True),
    sa.Column("limit_usd", sa.Float, nullable=True),
    sa.Column("reserved_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("reserved_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("spent_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("spent_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# A job of OpenAI's Batch API, recorded as an intent before anything is uploaded (``intent_id``,
# ours, also the remote batch's metadata key), then its file and its batch as they become known.
openai_batches = sa.Table(
    "openai_batches",
    metadata,
    sa.Column("intent_id", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("task_count", sa.Integer, nullable=False),
    # sha256 of the request file as uploaded: an upload that a crash left unrecorded is found by it.
    sa.Column("content_hash", sa.String(64), nullable=False, index=True),
    sa.Column("content_bytes", sa.BigInteger, nullable=False),
    sa.Column("file_id", sa.String(128), nullable=True),
    sa.Column("batch_id", sa.String(128), nullable=True, unique=True),
    # planned, uploaded, then the remote status (validating … completed, failed, expired,
    # cancelled), then ingested when every line is settled; abandoned when it never went out.
    sa.Column("status", sa.String(16), nullable=False, index=True),
    # The remote batch's own status when last seen (kept once the job is ingested: completed,
    # failed, expired or cancelled).
    sa.Column("remote_status", sa.String(16), nullable=True),
    sa.Column("request_total", sa.Integer, nullable=True),
    sa.Column("request_completed", sa.Integer, nullable=True),
    sa.Column("request_failed", sa.Integer, nullable=True),
    sa.Column("output_file_id", sa.String(128), nullable=True),
    sa.Column("error_file_id", sa.String(128), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    # The budgets its lines reserved against (at the batch price), and the completion limit its
    # lines carry under them (None: no budget; the limit the model's settings give).
    sa.Column("budget_keys", sa.JSON, nullable=True),
    sa.Column("completion_cap", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
)

# The tasks of a Batch API job, one line each. ``open_task_id`` is the task id while the job may
# still answer it (NULL once its line is settled or the job is over): unique, so a task is in at
# most one open job at a time on either backend.
openai_batch_lines = sa.Table(
    "openai_batch_lines",
    metadata,
    sa.Column("intent_id", sa.String(64), primary_key=True),
    # Indexed on its own too: a task's lines in every job are looked up by it.
    sa.Column("task_id", sa.String(128), primary_key=True, index=True),
    sa.Column("ordinal", sa.Integer, nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False, index=True),
    sa.Column("step", sa.String(32), nullable=False),
    sa.Column("open_task_id", sa.String(128), nullable=True, unique=True),
    # pending, answered (its checkpoint stored), failed (an error line: category, status),
    # expired (batch_expired), unanswered (the job ended without a line for it).
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("category", sa.String(32), nullable=True),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    # What the line reserved of its job's budgets until it is settled (0: none).
    sa.Column("reserved_tokens", sa.Integer, nullable=False, default=0, server_default="0"),
    sa.Column("reserved_usd", sa.Float, nullable=False, default=0.0, server_default="0"),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)
