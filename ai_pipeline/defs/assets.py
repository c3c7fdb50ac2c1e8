"""The assets: the analysis stages of every document (one multi-asset), and the failure report.

``analyse_documents`` covers a range of ``documents`` partitions per run (sensor runs, CLI runs and
backfills alike; a single document is a range of one) and analyses its documents concurrently
(``ai_pipeline.batch``). Dagster would mark the whole range materialized if the step returned
outputs, so instead, per document and stage, the step reports a materialization once that
stage's checkpoint is durable, and a check evaluation for each check of the LLM output: Dagster's
own events, written for the documents that finished meanwhile in one transaction
(``grouped_writes``, where the storage has it), then yielded. If
any document failed, the step ends by raising ``Failure`` listing each failed document and its
category: Dagster then shows FAILED for exactly those documents, from the stage that failed on.
Where run creation wrote one planned event per asset rather than one per
document (the accelerator's event log), the step first writes the failed documents'
per-partition planned events (``_mark_failed``), which that status rests on.

``failure_report`` reads every document's results row through the results IO manager and reports
counts by state and category, failures by day, tokens and cost.
"""

import base64
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from ai_pipeline import tracing
from ai_pipeline.batch import run_batch_groups
from ai_pipeline.defs.acceleration import (
    planned_events_per_partition,
    report_planned_materialization,
)
from ai_pipeline.defs.backfills import REPLACED_TAG
from ai_pipeline.defs.checks import check_evaluations, check_specs
from ai_pipeline.defs.io_managers import ResultsIOManager
from ai_pipeline.defs.jobs import DOCUMENTS_PER_BACKFILL_RUN
from ai_pipeline.defs.logs import run_log
from ai_pipeline.defs.openai_batches import VIA_TAG, batch_jobs
from ai_pipeline.defs.partitions import NAMED_DOCUMENTS, named_by
from ai_pipeline.defs.replan import (
    HANDOVER_SECONDS,
    hand_over,
    left_to_replans,
    planned_by_dagster,
    replan_backfill,
)
from ai_pipeline.defs.resources import LLMResource, PipelineSettings, ResultsStore
from ai_pipeline.defs.run_health import beating
from ai_pipeline.defs.runs import run_is_over
from ai_pipeline.defs.site import ANALYSIS_TAG, DEFAULT_SITE, Site
from ai_pipeline.engine import Analyser
from ai_pipeline.intake import BATCH_TAG
from ai_pipeline.notify import Notifier
from ai_pipeline.openai_batch.operations import submit as submit_to_batch_api
from ai_pipeline.reporting import build_report, chart_png, current_task_suffix, to_markdown
from ai_pipeline.spend import Meter, Prices, run_budgets
from ai_pipeline.stages import STAGES, Stage, StageDeferred, StageDone, StageFailed
from ai_pipeline.states import State
from ai_pipeline.store import Store

# The most documents whose events the step writes in one transaction: the documents that finished
# while it wrote the last group's (one at a time when it keeps up with the LLM).
GROUP_DOCUMENTS = 50

# The keys of the product's own code location (one analysis, no prefix).
ANALYSIS_KEYS = DEFAULT_SITE.keys
DOCUMENT_TEXT, LLM_ANALYSIS, VALIDATED_ANALYSIS, ANALYSIS_RESULTS, COMPLETION_NOTICE = ANALYSIS_KEYS
GROUP = DEFAULT_SITE.group

_DESCRIPTIONS = {
    Stage.DOCUMENT_TEXT: "The document's normalised text, read from the file it arrived as.",
    Stage.LLM_ANALYSIS: "The LLM's reply for the document (checkpointed per task id: paid for once).",
    Stage.VALIDATED_ANALYSIS: "The reply that passed every check: schema, confidence, refusal, grounding.",
    Stage.ANALYSIS_RESULTS: "One upserted row per document in the results table.",
    Stage.COMPLETION_NOTICE: "The completion notice POSTed to the webhook, exactly once "
    "(Idempotency-Key: its task id); skipped when AI_PIPELINE_WEBHOOK_URL is unset.",
}


def _specs(site: Site) -> list[dg.AssetSpec]:
    # What the analysis depends on: a new version (or declaration) is new code for these stages.
    version = site.declaration.tag()
    specs = []
    for i, stage in enumerate(STAGES):
        spec = dg.AssetSpec(
            site.key(stage),
            deps=[site.key(STAGES[i - 1])] if i else [],
            description=_DESCRIPTIONS[stage],
            group_name=site.group,
            skippable=True,
            partitions_def=site.partitions_def,
            kinds={"sql"} if stage == Stage.ANALYSIS_RESULTS else {"python"},
            code_version=None if stage == Stage.DOCUMENT_TEXT else version,
            tags={ANALYSIS_TAG: site.declaration.name},
        )
        if stage == Stage.ANALYSIS_RESULTS:
            spec = spec.with_io_manager_key(site.name("results_io_manager"))
        specs.append(spec)
    return specs


def build_analysis_assets(
    site: Site, run_size: int = DOCUMENTS_PER_BACKFILL_RUN
) -> dg.AssetsDefinition:
    """The analysis stages of ``site``'s analysis, as one multi-asset over its documents."""

    @dg.multi_asset(
        name=site.op,
        specs=_specs(site),
        check_specs=check_specs(site),
        can_subset=True,
        partitions_def=site.partitions_def,
        backfill_policy=dg.BackfillPolicy.multi_run(run_size),
        # A run may name the documents of its range it works on (``ai_pipeline.defs.partitions``).
        config_schema={NAMED_DOCUMENTS: dg.Field([str], is_required=False)},
        required_resource_keys={
            site.name(k) for k in ("results_store", "llm", "settings", "results_io_manager")
        },
    )
    def analyse(context: dg.AssetExecutionContext) -> Iterator[Any]:
        """Read, analyse, check and store every document of the run's partition range."""
        resources = context.resources
        results_store = getattr(resources, site.name("results_store"))
        # Its sign of life for Dagster's run monitoring (``run_health``) while it works.
        with beating(results_store.get(), context.run.run_id):
            yield from _analyse(
                context,
                site,
                results_store=results_store,
                llm=getattr(resources, site.name("llm")),
                settings=getattr(resources, site.name("settings")),
                results_io_manager=getattr(resources, site.name("results_io_manager")),
            )

    return analyse


def _analyse(
    context: dg.AssetExecutionContext,
    site: Site,
    *,
    results_store: ResultsStore,
    llm: LLMResource,
    settings: PipelineSettings,
    results_io_manager: ResultsIOManager,
) -> Iterator[Any]:
    # Every stage runs for every document whatever the selection (each is checkpointed, so a
    # stage already done costs nothing), and every stage that completed is reported: a backfill
    # of analysis_results alone then also clears the upstream stages' FAILED status.
    selected_checks = set(context.selected_asset_check_keys)
    # A run may name the documents of its range it works on (a batched backfill of scattered
    # documents): the others are left as they are, no call and no event.
    named = named_by(context.op_execution_context.op_config)
    document_ids = sorted(k for k in context.partition_keys if named is None or k in named)
    store = results_store.get()
    tracing.configure_from_env()
    config = settings.resolve()
    backfill_id = planned_by_dagster(context.run, site)
    if backfill_id is not None:
        # A run of a backfill that Dagster planned: the documents none of its runs has begun go
        # in fewer runs (the backfill planner sensor requests them), before this one's work.
        policy = context.assets_def.backfill_policy
        replaced = replan_backfill(
            context.instance,
            store,
            site,
            current_task_suffix(config, store.analysis),
            backfill_id,
            (policy.max_partitions_per_run if policy else None) or DOCUMENTS_PER_BACKFILL_RUN,
        )
        if replaced is not None:
            context.log.info(replaced.describe())
    left = left_to_replans(store, context.run, document_ids)
    if left:
        context.log.info(
            f"{len(left)} of this run's documents were taken by a replan of its backfill: they "
            "are analysed in the replan's runs, not here"
        )
        if not hand_over(context.instance, context.run, site, left):
            context.log.warning(
                f"no run of a replan holds them after {HANDOVER_SECONDS:.0f} s (is the backfill "
                "planner sensor stopped?): should the backfill end without them, "
                "`ai-pipeline backfill --failed` runs them"
            )
        document_ids = [d for d in document_ids if d not in left]
        if not document_ids and REPLACED_TAG not in context.run.tags:
            context.instance.add_run_tags(context.run.run_id, {REPLACED_TAG: "replan"})
    notifier = None
    if config.webhook_url:
        notifier = Notifier(config.webhook_url)
    else:
        context.log.info("no webhook configured (AI_PIPELINE_WEBHOOK_URL): no notices sent")
    budgets = run_budgets(
        store,
        context.run.tags,
        run_id=context.run.run_id,
        batch_id=context.run.tags.get(BATCH_TAG),
        tokens=config.run_budget_tokens,
        usd=config.run_budget_usd,
    )
    meter = Meter(
        store,
        Prices.of(config),
        run_id=context.run.run_id,
        budget_keys=budgets,
        completion_reserve=config.completion_reserve_tokens,
    )
    analyser = Analyser(
        store,
        llm.client(meter=meter, call_slots=store.call_slots),
        results_io_manager,
        log=run_log(
            context.log, context.run.tags, run_id=context.run.run_id, json_path=config.json_log
        ),
        run_id=context.run.run_id,
        min_confidence=config.min_confidence,
        notifier=notifier,
        retry_budget=config.retry_budget,
        lease_seconds=config.lease_seconds,
        claim_wait_seconds=config.claim_wait_seconds,
        section_chars=config.section_chars,
    )
    analyser.claims.owner_over = run_is_over(context.instance)
    in_batch_api = _in_batch_api(store, analyser.task_for, document_ids)
    if in_batch_api:
        # Their requests are in an open Batch API job: its sensor launches their runs when it
        # is answered; a call now would pay for them twice.
        document_ids = [d for d in document_ids if d not in in_batch_api]
        context.log.warning(_batch_api_line(store, in_batch_api))
    if context.run.tags.get(VIA_TAG) == "batch":
        # Launched to go by the Batch API (a tag on a UI backfill): the requests go in jobs and
        # the sensor runs their documents when answered; only what cannot go in one is analysed
        # here.
        jobs, batch_config = batch_jobs(store, llm)
        sent = submit_to_batch_api(jobs, batch_config.analysis_model, document_ids)
        context.log.info(
            f"{sent['tasks']} documents sent in {len(sent['jobs'])} Batch API jobs "
            f"({', '.join(j['batch_id'] or j['intent_id'] for j in sent['jobs']) or 'none'}); "
            f"{sent['in_open_jobs']} in open jobs already; its sensor runs them when answered"
        )
        left = set(sent["left_to_sync"])
        document_ids = [d for d in document_ids if d in left]
    context.log.info(
        f"analysing {len(document_ids)} documents with {analyser.llm.model} "
        f"({analyser.analysis.name} {analyser.analysis.tag()})"
    )
    failed: dict[str, StageFailed] = {}
    elsewhere: dict[str, StageDeferred] = {}
    done = 0
    for group in run_batch_groups(analyser, document_ids, most=GROUP_DOCUMENTS):
        finished: list[StageDone] = []
        for document_id, events in group:
            for event in events:
                if isinstance(event, StageFailed):
                    failed[document_id] = event
                elif isinstance(event, StageDeferred):
                    elsewhere[document_id] = event
                else:
                    finished.append(event)
        yield from _report(context, site, finished, selected_checks)
        before, done = done, done + len(group)
        if done // 25 > before // 25 or done == len(document_ids):
            context.log.info(
                f"{done}/{len(document_ids)} documents processed, {len(failed)} failed"
            )
    tracing.flush()
    spent = store.spend.for_run(context.run.run_id)
    spend_line = (
        f"spent in this run: {spent.tokens:,} tokens over {spent.attempts} LLM attempts, "
        f"${spent.cost_usd:.4f}"
    )
    for key in budgets:
        state = store.spend.budget(key)
        if state is not None:
            spend_line += f"; budget {state.describe()}"
    context.log.info(spend_line)
    if site.checked_key in context.selected_asset_keys:
        # The run's totals where the UI shows an asset's history: one observation per run.
        yield dg.AssetObservation(
            asset_key=site.checked_key,
            metadata={
                "run_id": context.run.run_id,
                "run_cost_usd": dg.MetadataValue.float(round(spent.cost_usd, 6)),
                "run_tokens": dg.MetadataValue.int(spent.tokens),
                "run_llm_attempts": dg.MetadataValue.int(spent.attempts),
                "spend": dg.MetadataValue.text(spend_line),
                "waiting_in_batch_api": dg.MetadataValue.int(len(in_batch_api)),
            },
        )
    if elsewhere:
        # Neither done nor failed here: the run that holds each reports it.
        context.log.warning(
            f"{len(elsewhere)} documents were in progress in other runs and were left to them: "
            + ", ".join(f"[TASK:{d.task_id}] in {d.holder}" for _, d in sorted(elsewhere.items()))
        )
    stopped = [f for f in failed.values() if f.category.stops_run]
    if stopped:
        # The run's settings are wrong: one message says which; the documents are left as they
        # were in the results database (QUEUED, no attempt counted, nobody's review).
        circuit = analyser.llm.circuit
        reason = circuit.message if circuit is not None else stopped[0].error
        category = circuit.category if circuit is not None else stopped[0].category
        _mark_failed(context, site, {d: f for d, f in failed.items() if not f.category.stops_run})
        raise dg.Failure(
            description=f"the run stopped ({category.value}): {reason}",
            metadata={
                "category": dg.MetadataValue.text(category.value),
                "reason": dg.MetadataValue.text(reason),
                "documents_left_as_they_were": dg.MetadataValue.int(len(stopped)),
                "failed": dg.MetadataValue.int(len(failed) - len(stopped)),
                "spend": dg.MetadataValue.text(spend_line),
            },
            allow_retries=False,
        )
    if failed:
        _mark_failed(context, site, failed)
        raise dg.Failure(
            description=f"{len(failed)} of {len(document_ids)} documents failed:\n"
            + "\n".join(
                f"[TASK:{f.task_id}] {f.category.value} at {f.stage}: {f.error}"
                for _, f in sorted(failed.items())
            ),
            metadata={
                "spend": dg.MetadataValue.text(spend_line),
                "cost_usd": dg.MetadataValue.float(round(spent.cost_usd, 6)),
                "tokens": dg.MetadataValue.int(spent.tokens),
                **{
                    d: dg.MetadataValue.text(f"{f.category.value} at {f.stage}: {f.error}"[:1000])
                    for d, f in sorted(failed.items())
                },
            },
            allow_retries=False,
        )


def _in_batch_api(
    store: Store, task_for: Callable[[str], str], document_ids: Sequence[str]
) -> dict[str, str]:
    """The documents whose analysis task is in an open Batch API job: document → its intent."""
    tasks = {task_for(d): d for d in document_ids}
    return {tasks[t]: intent for t, intent in store.openai_batches.open_jobs_of(tasks).items()}


def _batch_api_line(store: Store, in_batch_api: Mapping[str, str]) -> str:
    """One line naming the Batch API jobs these documents wait in, with their counts."""
    jobs = []
    for intent, count in sorted(Counter(in_batch_api.values()).items()):
        job = store.openai_batches.get(intent)
        remote = "not sent yet"
        if job is not None and job.batch_id:
            done = job.request_completed or 0
            remote = f"batch {job.batch_id} {job.remote_status}, {done}/{job.request_total} done"
        jobs.append(f"{intent} ({remote}): {count}")
    return (
        f"{len(in_batch_api)} documents are waiting in open Batch API jobs and were left to "
        f"them, no call made: " + "; ".join(jobs)
    )


def with_backfill_run_size(assets: dg.AssetsDefinition, size: int | None) -> dg.AssetsDefinition:
    """The analysis assets with backfills cut into runs of ``size`` documents: a daemon-launched
    run pays a process start and a code import, so larger runs pay it less often. Without a size
    they keep ``DOCUMENTS_PER_BACKFILL_RUN`` (the size of the backfills Dagster plans: the UI's;
    the package plans its own from the run queue, ``ai_pipeline.defs.backfills``)."""
    if size is None:
        return assets
    return assets.with_attributes(backfill_policy=dg.BackfillPolicy.multi_run(size))


def _mark_failed(
    context: dg.AssetExecutionContext, site: Site, failed: dict[str, StageFailed]
) -> None:
    """Make Dagster show FAILED for exactly the failed documents, from the stage each failed at.

    Dagster derives a partition's FAILED status from a planned event with no materialization in
    a failed run. When run creation wrote one planned event per asset and run (the fast way), the
    step writes the per-partition ones itself, for the failed documents only; when it wrote one
    per partition (the default), there is nothing to add.
    """
    if planned_events_per_partition(context.instance):
        return
    step_key = context.get_step_execution_context().step.key
    selected = context.selected_asset_keys
    for document_id, failure in sorted(failed.items()):
        for stage in STAGES[STAGES.index(failure.stage) :]:
            if site.key(stage) in selected and not report_planned_materialization(
                context.instance, context.run, step_key, site.key(stage), document_id
            ):
                return


def _report(
    context: dg.AssetExecutionContext,
    site: Site,
    finished: Sequence[StageDone],
    selected_checks: set[dg.AssetCheckKey],
) -> list[dg.DagsterEvent]:
    """Each finished stage's materialization, then its check evaluations, written to the event
    log in one transaction for the whole group (``grouped_writes``, where the storage has it);
    the events, for the step to yield."""
    instance = context.instance
    step_context = context.get_step_execution_context()
    grouped = getattr(instance.event_log_storage, "grouped_writes", contextlib.nullcontext)
    written = []
    with grouped():
        for event in finished:
            asset_key = site.key(event.stage)
            materialization = dg.AssetMaterialization(
                asset_key=asset_key,
                partition=event.document_id,
                metadata={k: v for k, v in event.metadata.items() if v is not None},
            )
            # Dagster's event, written as it is made (what the step's yielded materialization
            # became); the check evaluations name it as their target.
            written.append(dg.DagsterEvent.asset_materialization(step_context, materialization))
            written.extend(
                dg.DagsterEvent.asset_check_evaluation(step_context, evaluation)
                for evaluation in check_evaluations(
                    instance, asset_key, event.document_id, event.checks, selected_checks
                )
            )
    return written


# What the results IO manager loads for the report: a pandas DataFrame, checked by its type's name
# so that loading the code location (every sensor tick's code server, every run worker) does not
# import pandas for a report it may never build.
RESULTS_FRAME = dg.DagsterType(
    name="ResultsDataFrame",
    description="A pandas DataFrame: one row per document of the results table.",
    type_check_fn=lambda _context, value: type(value).__name__ == "DataFrame",
)


def build_failure_report(site: Site) -> dg.AssetsDefinition:
    """The failure report of ``site``'s analysis."""

    @dg.asset(
        key=site.key("failure_report"),
        ins={
            "analysis_results": dg.AssetIn(
                site.results_key,
                partition_mapping=dg.AllPartitionMapping(),
                dagster_type=RESULTS_FRAME,
            )
        },
        group_name=site.group,
        kinds={"pandas"},
        description="Counts by state and category, failures by day, success rate, tokens and cost.",
        required_resource_keys={site.name("results_store")},
    )
    def failure_report(
        context: dg.AssetExecutionContext, analysis_results: Any
    ) -> dg.MaterializeResult:
        return _failure_report(
            context, getattr(context.resources, site.name("results_store")), analysis_results
        )

    return failure_report


def _failure_report(
    context: dg.AssetExecutionContext, results_store: ResultsStore, analysis_results: Any
) -> dg.MaterializeResult:
    report = build_report(results_store.get(), analysis_results)
    by_state = report["by_state"]
    png = chart_png(report)
    chart_path = Path(context.instance.root_directory) / "reports" / "failure_report.png"
    chart_path.parent.mkdir(parents=True, exist_ok=True)
    chart_path.write_bytes(png)
    chart = (
        "![documents by state and failures by category]"
        f"(data:image/png;base64,{base64.b64encode(png).decode()})"
    )
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.md(to_markdown(report)),
            "chart": dg.MetadataValue.md(chart),
            "chart_file": dg.MetadataValue.path(str(chart_path)),
            "documents": report["documents"],
            "success_rate": report["success_rate"],
            # Besides the completed ones, every document is counted in one of these three.
            "failed": _count(by_state, State.FAILED, State.DEAD_LETTER),
            # Not ended yet: waiting for a run, or in one.
            "unfinished": _count(by_state, State.PENDING, State.QUEUED, State.RUNNING),
            "cancelled": _count(by_state, State.CANCELLED),
            "estimated_cost_usd": report["estimated_cost_usd"],
            "tokens": report["tokens"]["prompt"] + report["tokens"]["completion"],
            # Every attempt, failed and repeated ones included (the usage of each reply).
            "spent_usd": report["spend"]["total"]["cost_usd"],
            # Of those tokens: prompt tokens served from the prompt cache (billed lower) and
            # reasoning tokens (billed as output, not in the replies).
            "cached_prompt_tokens": report["spend"]["total"]["cached_tokens"],
            "reasoning_tokens": report["spend"]["total"]["reasoning_tokens"],
            "failures_cost_usd": round(
                sum(t["cost_usd"] for t in report["spend"]["failures_by_category"].values()), 6
            ),
            "reanalyses_cost_usd": report["spend"]["reanalyses"]["cost_usd"],
            # The newest batches' spend, each over all its documents' attempts.
            "spend_by_batch": dg.MetadataValue.json(report["spend"]["by_batch"]),
            # Analyses made under another prompt version or model: `backfill --stale`.
            "stale_analyses": sum(report["stale"].values()),
        }
    )


def _count(by_state: dict[str, int], *states: State) -> int:
    """How many documents are in any of ``states``."""
    return sum(by_state.get(state.value, 0) for state in states)


# The product's own code location's (``ai_pipeline.definitions`` builds its own through the
# factory; these serve whoever materializes the assets directly).
analyse_documents = build_analysis_assets(DEFAULT_SITE)
failure_report = build_failure_report(DEFAULT_SITE)
