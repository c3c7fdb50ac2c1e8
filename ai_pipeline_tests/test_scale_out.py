"""Scale-out through dagster-celery's ``CeleryRunLauncher``, across hosts made with namespaces.

The deployment is ``deploy/scale-out/`` as it is (its files linked, not copied): the main
namespace holds the daemon (with the instance's ``dagster.yaml``), a Redis broker and backend, a
``socat`` forward to the machine's PostgreSQL and the LLM simulator, all listening only on the
bridge address of ``ai_pipeline_tests.hosts.Network``; each worker host is a network namespace
that reaches nothing but that address, running ``deploy/scale-out/worker.sh`` under its own host
name.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ai_pipeline_tests.dagster_procs import DagsterProcess, running
from ai_pipeline_tests.hosts import Network, Process, unavailable_reason
from ai_pipeline_tests.postgres import PG_USER, PostgresDatabases, skip_or_fail
from ai_pipeline_tests.support import (
    REPO,
    TEST_API_KEY,
    TEST_MODEL,
    cli,
    make_inbox,
    sample_text,
    task_of,
)

pytest.importorskip("dagster_celery")

DEPLOY = REPO / "deploy" / "scale-out"
DOCUMENTS = 200
RUN_SIZE = 25
WORKER_RUNS = 2  # runs at once on each worker host (its --concurrency)
LLM_CONCURRENCY = 8  # calls in flight per run


@dataclass
class Deployment:
    network: Network
    env: dict[str, str]
    simulator: object
    daemon: DagsterProcess
    workers: list[Process]
    home: Path


def linked_home(folder: Path) -> Path:
    """A DAGSTER_HOME whose ``dagster.yaml`` is deploy/scale-out/dagster.yaml itself."""
    folder.mkdir(parents=True)
    (folder / "dagster.yaml").symlink_to(DEPLOY / "dagster.yaml")
    return folder


@pytest.fixture
def deployment(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_databases: PostgresDatabases,
) -> Iterator[Deployment]:
    """Two worker hosts, the broker, PostgreSQL and the simulator on the bridge address only, and
    a daemon launching runs through CeleryRunLauncher; all of it removed at the end. The LLM's
    latency in ms: the test's ``latency_ms`` mark (50 by default); its ``global_cap`` mark sets
    ``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY`` on every host."""
    mark = request.node.get_closest_marker("latency_ms")
    latency_ms = int(mark.args[0]) if mark else 50
    cap = request.node.get_closest_marker("global_cap")
    from ai_pipeline.rehearsal.faults import SimulatorConfig
    from ai_pipeline.rehearsal.simulator import SimulatorServer

    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    with Network(2, tmp_path) as network:
        address = network.address
        redis_port, pg_port = network.broker_and_postgres()
        instance_db = postgres_databases.create("dagster")
        results_db = postgres_databases.create("results")
        config = SimulatorConfig(latency_ms=latency_ms, max_concurrency=64)
        with SimulatorServer(config, host=address) as simulator:
            home = linked_home(tmp_path / "main")
            env = {
                "DAGSTER_HOME": str(home),
                "DAGSTER_PG_HOST": address,
                "DAGSTER_PG_PORT": str(pg_port),
                "DAGSTER_PG_DB": instance_db,
                "DAGSTER_PG_USERNAME": PG_USER,
                "DAGSTER_PG_PASSWORD": "",
                "AI_PIPELINE_CELERY_BROKER": f"redis://{address}:{redis_port}/0",
                "AI_PIPELINE_CELERY_BACKEND": f"redis://{address}:{redis_port}/1",
                "AI_PIPELINE_MAX_CONCURRENT_RUNS": str(2 * WORKER_RUNS),
                "AI_PIPELINE_DATABASE_URL": (
                    f"postgresql://{PG_USER}@{address}:{pg_port}/{results_db}"
                ),
                "AI_PIPELINE_BACKFILL_RUN_SIZE": str(RUN_SIZE),
                "AI_PIPELINE_LLM_CONCURRENCY": str(LLM_CONCURRENCY),
                "AI_PIPELINE_SETTLE_SECONDS": "0",
                "OPENAI_BASE_URL": simulator.base_url,
                "OPENAI_API_KEY": TEST_API_KEY,
                "AI_PIPELINE_MODEL": TEST_MODEL,
                "AI_PIPELINE_WORKER_RUNS": str(WORKER_RUNS),
            }
            if cap:
                env["AI_PIPELINE_GLOBAL_LLM_CONCURRENCY"] = str(cap.args[0])
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            # The venv's bin first: dagster-celery runs `celery` from PATH.
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
            monkeypatch.setenv("PATH", path)
            import dagster as dg

            with dg.DagsterInstance.get():  # the instance's tables, before any process starts
                pass
            workers = []
            for host in network.hosts:
                host_env = os.environ | {
                    "DAGSTER_HOME": str(linked_home(tmp_path / host.name)),
                    "AI_PIPELINE_WORKER_NAME": f"worker-{host.name}",
                }
                workers.append(host.start("worker", [str(DEPLOY / "worker.sh")], host_env))
            with running(DagsterProcess.daemon(tmp_path / "daemon.log"), home) as daemon:
                yield Deployment(network, dict(os.environ), simulator, daemon, workers, home)
            for worker in workers:
                worker.stop()
    assert not network.leftovers(), network.leftovers()


def wait_for_workers(deployment: Deployment, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ready = [
            w for w in deployment.workers if " ready." in w.log_path.read_text(errors="replace")
        ]
        if len(ready) == len(deployment.workers):
            return
        for worker in deployment.workers:
            assert worker.alive(), f"{worker.name} exited:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, "\n\n".join(w.log_tail() for w in deployment.workers)
        time.sleep(1)


def wait_for_runs_to_end(deployment: Deployment, instance: object, timeout: float = 60) -> list:
    """Every run of the instance, once none is queued, starting or started."""
    from ai_pipeline_tests.dagster_procs import wait_for
    from ai_pipeline_tests.support import TERMINAL

    def ended() -> list:
        runs = instance.get_runs()  # type: ignore[attr-defined]
        return runs if all(r.status in TERMINAL for r in runs) else []

    return wait_for(deployment.daemon, "every run to end", ended, timeout)  # type: ignore[no-any-return]


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
def test_a_batch_runs_on_both_worker_hosts_each_document_paid_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    """200 submitted documents run on two worker hosts of the CeleryRunLauncher, each completed
    with exactly one LLM call."""
    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline_tests.support import doc_id

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    deployment.daemon.start()
    wait_for_workers(deployment)
    assert cli("submit", str(inbox), "--batch", "scale-out", "--wait", "--timeout", "240") == 0

    simulator = deployment.simulator
    ids = [doc_id(t) for t in texts]
    assert simulator.stats()["total"] == DOCUMENTS  # type: ignore[attr-defined]
    assert all(simulator.requests_for(task_of(d)) == 1 for d in ids)  # type: ignore[attr-defined]
    with dg.DagsterInstance.get() as instance:
        # submit --wait returns at the last settled document; its run ends a moment later.
        runs = wait_for_runs_to_end(deployment, instance)
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [
            (r.run_id, r.status) for r in runs
        ]
        hosts = {r.run_id: r.tags.get(WORKER_HOST_TAG) for r in runs}
        assert set(hosts.values()) == {h.name for h in deployment.network.hosts}, hosts
        for run in runs:
            said = [
                e.message
                for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
                if e.message.startswith("Run executing on worker host")
            ]
            assert said == [
                f"Run executing on worker host {hosts[run.run_id]} "
                f"(Celery worker worker-{hosts[run.run_id]}@{hosts[run.run_id]})"
            ]
    counts = {h: list(hosts.values()).count(h) for h in set(hosts.values())}
    print(f"runs per worker host: {counts}")


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
@pytest.mark.latency_ms(400)
def test_a_lost_worker_host_fails_its_runs_and_the_batch_completes_on_the_other(
    deployment: Deployment, tmp_path: Path
) -> None:
    """A worker host killed mid-batch (its processes SIGKILLed, its link cut): run monitoring fails
    its runs, the daemon retries them on the other host, and every document completes with no
    more calls paid twice than were in flight on the lost host."""
    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline.states import State
    from ai_pipeline_tests.dagster_procs import wait_for
    from ai_pipeline_tests.support import doc_id, results_store

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    deployment.daemon.start()
    wait_for_workers(deployment)
    assert cli("submit", str(inbox), "--batch", "lost-host") == 0
    lost = deployment.network.hosts[0]
    simulator: Any = deployment.simulator
    with dg.DagsterInstance.get() as instance:

        def running_on_lost_host() -> list:
            started = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
            return [r for r in started if r.tags.get(WORKER_HOST_TAG) == lost.name]

        wait_for(deployment.daemon, f"a run started on {lost.name}", running_on_lost_host, 180)
        # Mid-run: some of its calls answered.
        wait_for(deployment.daemon, "LLM calls", lambda: simulator.stats()["total"] >= 40, 120)
        lost_runs = {r.run_id for r in running_on_lost_host()}
        lost.kill()
        killed_at = time.time()
        print(f"killed {lost.name} with runs {sorted(lost_runs)} in flight")

    code = cli("submit", str(inbox), "--batch", "lost-host", "--wait", "--timeout", "400")
    ids = [doc_id(t) for t in texts]
    paid = [simulator.requests_for(task_of(d)) for d in ids]
    with dg.DagsterInstance.get() as instance:
        runs = wait_for_runs_to_end(deployment, instance, 120)
        statuses = {r.run_id: r.status for r in runs}
        failed = {r for r, s in statuses.items() if s == dg.DagsterRunStatus.FAILURE}
        ended = [
            round(record.end_time - killed_at, 1)
            for record in instance.get_run_records(dg.RunsFilter(run_ids=list(lost_runs)))
            if record.end_time
        ]
        messages = [
            e.message
            for run_id in failed
            for e in instance.all_logs(run_id)
            if "does not answer" in (e.message or "")
        ]
    print(
        f"{len(runs)} runs, {len(failed)} failed, failed {ended} s after the kill; "
        f"paid twice: {sum(p - 1 for p in paid if p > 1)}"
    )
    assert code == 0
    assert all(p >= 1 for p in paid)
    # At most the calls in flight on the lost host were paid again.
    assert sum(p - 1 for p in paid) <= len(lost_runs) * LLM_CONCURRENCY
    assert lost_runs <= failed and messages, (statuses, messages)
    store = results_store()
    counts = store.documents.count_by_state(ids)
    assert counts.get(State.COMPLETED) == DOCUMENTS and not counts.get(State.RUNNING), counts
    # One result row per document (document_id is the table's key).
    url = os.environ["AI_PIPELINE_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg2://")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("select count(*) from results")).scalar_one()
    engine.dispose()
    assert rows == DOCUMENTS


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
@pytest.mark.latency_ms(4000)
def test_a_drained_worker_host_finishes_its_runs_and_takes_no_more(
    deployment: Deployment, tmp_path: Path
) -> None:
    """A worker host drained mid-batch with the command of docs/scale-out.md (Celery's warm
    shutdown over the broker): its runs in flight finish there and succeed — run monitoring's
    health check keeps them healthy although the draining worker answers no ping, because their
    processes still beat — its worker then exits, the rest of the batch runs on the other host,
    and no document is paid twice (a drain is not a crash)."""
    import subprocess

    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline.states import State
    from ai_pipeline_tests.dagster_procs import wait_for
    from ai_pipeline_tests.support import doc_id, results_store

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    deployment.daemon.start()
    wait_for_workers(deployment)
    assert cli("submit", str(inbox), "--batch", "drain") == 0
    drained, other = deployment.network.hosts
    node = f"worker-{drained.name}@{drained.name}"
    simulator: Any = deployment.simulator
    with dg.DagsterInstance.get() as instance:
        launcher: Any = instance.run_launcher

        def running_on_drained_host() -> list:
            started = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
            return [r for r in started if r.tags.get(WORKER_HOST_TAG) == drained.name]

        wait_for(deployment.daemon, f"a run on {drained.name}", running_on_drained_host, 180)
        # Its first calls answered: the run is mid-way.
        wait_for(deployment.daemon, "LLM calls", lambda: simulator.stats()["total"] >= 8, 120)
        in_flight = running_on_drained_host()
        drain = subprocess.run(
            [
                str(Path(sys.executable).parent / "celery"),
                *("-A", "dagster_celery.app", "-b", os.environ["AI_PIPELINE_CELERY_BROKER"]),
                *("control", "shutdown", "-d", node),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        drained_at = time.time()
        # 69: "No nodes replied" — a shutdown sends no reply (docs/scale-out.md).
        assert drain.returncode in (0, 69), drain.stderr
        wait_for(
            deployment.daemon,
            f"{node} to stop answering",
            lambda: not launcher.celery.control.ping(destination=[node], timeout=1),
            60,
        )
        # What run monitoring asks of each started run while the drained worker is silent.
        checked = []
        for run in in_flight:
            current = instance.get_run_by_id(run.run_id)
            if current is not None and current.status == dg.DagsterRunStatus.STARTED:
                checked.append(launcher.check_run_worker_health(current).status.name)
        print(f"drained {node} with {len(in_flight)} runs in flight; health: {checked}")
        assert checked and set(checked) == {"RUNNING"}, checked
        wait_for(
            deployment.daemon, f"{drained.name}'s worker to exit", lambda: not drained.pids(), 180
        )

    code = cli("submit", str(inbox), "--batch", "drain", "--wait", "--timeout", "400")
    ids = [doc_id(t) for t in texts]
    paid = [simulator.requests_for(task_of(d)) for d in ids]
    with dg.DagsterInstance.get() as instance:
        runs = wait_for_runs_to_end(deployment, instance, 120)
        records = instance.get_run_records()
    statuses = {r.run_id: r.status for r in runs}
    hosts = {r.run_id: r.tags.get(WORKER_HOST_TAG) for r in runs}
    started_after = {
        r.dagster_run.run_id for r in records if r.start_time and r.start_time > drained_at + 1
    }
    print(f"{len(runs)} runs, hosts {hosts}, {len(started_after)} started after the drain")
    assert code == 0
    assert set(statuses.values()) == {dg.DagsterRunStatus.SUCCESS}, statuses
    assert all(hosts[r.run_id] == drained.name for r in in_flight), "finished where they ran"
    assert started_after and all(hosts[r] == other.name for r in started_after), hosts
    assert paid == [1] * DOCUMENTS, "a drain pays nothing twice"
    counts = results_store().documents.count_by_state(ids)
    assert counts.get(State.COMPLETED) == DOCUMENTS and not counts.get(State.RUNNING), counts


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
@pytest.mark.latency_ms(1000)
def test_a_batch_budget_holds_across_worker_hosts(deployment: Deployment, tmp_path: Path) -> None:
    """``submit --budget-tokens N`` with the batch's runs on two hosts at once: every run reserves
    against the one budget in the results database, so the tokens the simulator counted stay
    within N; the documents left are held (BUDGET_REACHED, no call, nobody's review), and a
    re-submission with a larger budget finishes them, one call each."""
    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline.failures import Category
    from ai_pipeline.intake import BATCH_TAG, batch_key
    from ai_pipeline.spend import batch_budget_key
    from ai_pipeline.states import State
    from ai_pipeline.store.rows import ReviewStatus
    from ai_pipeline_tests.support import doc_id, results_store

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    budget = 20_000  # about a third of the batch
    deployment.daemon.start()
    wait_for_workers(deployment)
    submit = ["submit", str(inbox), "--batch", "capped", "--wait", "--timeout", "300"]
    assert cli(*submit, "--budget-tokens", str(budget)) == 1

    simulator: Any = deployment.simulator
    spent = simulator.stats()["tokens"]
    assert 0 < spent <= budget
    store = results_store()
    with dg.DagsterInstance.get() as instance:
        runs = wait_for_runs_to_end(deployment, instance)
        runs = [r for r in runs if r.tags.get(BATCH_TAG) == batch_key(ids)]
        paying = {
            r.tags.get(WORKER_HOST_TAG) for r in runs if store.spend.for_run(r.run_id).attempts
        }
    assert paying == {h.name for h in deployment.network.hosts}, paying
    docs = {d.document_id: d for d in store.documents.rows(ids)}
    held = [d for d in ids if docs[d].category == Category.BUDGET_REACHED]
    assert held and len(held) < DOCUMENTS
    assert all(simulator.requests_for(task_of(d)) == 0 for d in held)
    assert not [i for i in store.reviews.items(ReviewStatus.OPEN) if i.document_id in held]
    state = store.spend.budget(batch_budget_key(batch_key(ids)))
    assert state is not None and state.spent_tokens == spent and state.reserved_tokens == 0
    print(f"{DOCUMENTS - len(held)} documents within {budget} tokens ({spent} spent)")

    assert cli(*submit, "--budget-tokens", str(budget * 10)) == 0
    assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}
    assert all(simulator.requests_for(task_of(d)) == 1 for d in ids)


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
def test_the_review_queue_holds_what_runs_on_either_host_sent_it(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Every tenth document of a batch answered with low confidence while its runs execute on two
    hosts: each of those is one open review item, whichever host's run sent it (none twice, none
    lost), after one call; approving them with the stored answer completes them with no call."""
    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline.failures import Category
    from ai_pipeline.states import State
    from ai_pipeline.store.rows import ReviewStatus
    from ai_pipeline_tests.support import doc_id, results_store

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    unsure = ids[::10]
    simulator: Any = deployment.simulator
    simulator.set_faults([{"kind": "low_confidence", "match": task_of(d)} for d in unsure])
    deployment.daemon.start()
    wait_for_workers(deployment)
    assert cli("submit", str(inbox), "--batch", "reviewed", "--wait", "--timeout", "240") == 1

    store = results_store()
    assert all(simulator.requests_for(task_of(d)) == 1 for d in ids)
    docs = {d.document_id: d for d in store.documents.rows(ids)}
    assert {(docs[d].state, docs[d].category) for d in unsure} == {
        (State.FAILED, Category.LOW_CONFIDENCE)
    }
    assert {docs[d].state for d in ids if d not in unsure} == {State.COMPLETED}
    items = store.reviews.items(ReviewStatus.OPEN)
    assert sorted(i.document_id for i in items) == sorted(unsure)
    with dg.DagsterInstance.get() as instance:
        wait_for_runs_to_end(deployment, instance)
        sent_from = {
            instance.get_run_by_id(docs[d].run_id).tags.get(WORKER_HOST_TAG)  # type: ignore[arg-type, union-attr]
            for d in unsure
        }
    assert sent_from == {h.name for h in deployment.network.hosts}, sent_from

    for d in unsure:
        assert cli("review", "approve", d, "--accept-output", "--by", "qa") == 0
    assert {d.state for d in store.documents.rows(ids)} == {State.COMPLETED}
    assert all(simulator.requests_for(task_of(d)) == 1 for d in ids), "no call to approve"
    assert store.reviews.items(ReviewStatus.OPEN) == []
    assert all(store.reviews.override(task_of(d)) is not None for d in unsure)


GLOBAL_CAP = 6


@pytest.mark.daemon
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.scaleout
@pytest.mark.latency_ms(400)
@pytest.mark.global_cap(GLOBAL_CAP)
def test_the_global_cap_holds_across_worker_hosts(deployment: Deployment, tmp_path: Path) -> None:
    """``AI_PIPELINE_GLOBAL_LLM_CONCURRENCY`` set to 6 on both hosts, whose four runs at once could
    have 32 calls out: the endpoint never has more than 6 requests in flight, runs on both hosts
    called it, every document is paid once and every slot is given back."""
    import dagster as dg

    from ai_pipeline.defs.celery_worker import WORKER_HOST_TAG
    from ai_pipeline_tests.support import doc_id, results_store

    texts = [sample_text(i) for i in range(DOCUMENTS)]
    inbox = make_inbox(tmp_path / "inbox", {f"doc{i:03}.txt": t for i, t in enumerate(texts)})
    ids = [doc_id(t) for t in texts]
    deployment.daemon.start()
    wait_for_workers(deployment)
    assert cli("submit", str(inbox), "--batch", "capped", "--wait", "--timeout", "300") == 0

    simulator: Any = deployment.simulator
    stats = simulator.stats()
    assert all(simulator.requests_for(task_of(d)) == 1 for d in ids)
    assert stats["peak_in_flight"] == GLOBAL_CAP, stats["peak_in_flight"]
    store = results_store()
    with dg.DagsterInstance.get() as instance:
        runs = wait_for_runs_to_end(deployment, instance)
        calling = {
            r.tags.get(WORKER_HOST_TAG) for r in runs if store.spend.for_run(r.run_id).attempts
        }
    assert calling == {h.name for h in deployment.network.hosts}, calling
    assert [s.holder for s in store.call_slots.of(GLOBAL_CAP)] == [None] * GLOBAL_CAP
