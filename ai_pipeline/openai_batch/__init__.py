"""Analysis through OpenAI's Batch API: half the price for work that can wait up to a day.

A *job* is one request file and the remote batch made of it. Its lines are tasks — the same task
ids, request bodies and checkpoints as the synchronous path — so mixing the two never pays twice:

==============  ===========================================================  =================
phase           what happens (each step recorded in ``store.openai_batches``)  after a crash
==============  ===========================================================  =================
plan            the tasks without a checkpoint and in no open job, their     nothing went out:
                request lines (``chat_request``, as a call sends them), cut   the intent is
                into files within 50,000 lines and 200 MB; the intent (tasks, planned again or
                file hash) recorded before anything is uploaded              resumed
upload          the file is uploaded, named by its hash — or the upload a    found by its name
                crash left unrecorded is found by it (``files.list``)        and size: reused
create          the remote batch, with our intent id in its metadata — or    found by its
                the one a crash left unrecorded (``batches.list``)           metadata: reused
poll            the remote status and request counts                         polled again
ingest          each answered line becomes its task's checkpoint, its usage  a line is settled
                recorded at the batch price; each error line is classified   once (compare-
                by the taxonomy (its status and error body), expired lines    and-set), its
                marked; lines never answered (cancelled) are released        checkpoint kept
==============  ===========================================================  =================

``BatchJobs.advance`` takes one job one phase further; ``BatchJobs.tick`` advances every
unfinished job within a bound of work (what a sensor calls each tick). A hook (``on_phase``)
is told after each outside effect and before it is recorded: the tests crash there.

The package, one module a concern: ``request_files`` (a document's request line, files within
the limits), ``planning`` (recording jobs, under budgets), ``jobs`` (``BatchJobs``: upload,
create, poll, cancel, tick), ``results`` (ingesting a job's output and error lines) and
``operations`` (submit, follow and report: what commands and sensors call).

This is not ``ai_pipeline.batch`` (the documents of one run, processed concurrently) nor
``ai_pipeline.store.batches`` (named sets of submitted documents). Nothing here knows Dagster;
what a finished line means for its document (a run that finds the checkpoint, validates and
stores it) is the launcher's business.
"""
