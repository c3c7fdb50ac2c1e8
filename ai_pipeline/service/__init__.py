"""The submission service (``ai-pipeline serve``): documents submitted over HTTP, followed live.

Seed 004's asynchronous pattern in front of the same Dagster instance and results database as
everything else: ``POST /api/v1/tasks`` records the tenant's document and answers 202 with a task
id at once; the ``submissions_sensor`` (``ai_pipeline.defs.sensors``) turns new tasks into
partitions and runs, so the work runs as Dagster runs (in the UI, through the run queue), never in
the web process; ``GET /api/v1/tasks/{id}`` and its server-sent events follow the document's state. One process
serves every analysis of the code location: a submission names its analysis, else goes to the
default one; each analysis's tasks are in its own results database, read by its own sensor.

- ``tenants``: the tenants file, keys and per-tenant limits.
- ``progress``: a task's state, progress and result (or a reviewer's rejection), from the store.
- ``inputs``: what a request may carry: id alphabets, storable text, name rules, bounded bodies,
  and the submitted document, a file or JSON text.
- ``auth``: the tenant of a request's key, its ``X-Tenant-Id`` and its per-minute limit.
- ``models``: the bodies the API answers and the statuses each operation may answer.
- ``events``: a task's server-sent event stream.
- ``review_page``: the review queue page and its signed forms.
- ``served``: the analyses the service serves, each with its settings and results database.
- ``thumbnails``: a PDF's first page within a fixed pixel budget, cached.
- ``app``: the FastAPI application and its routes.
"""
