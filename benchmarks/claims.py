"""What one owner per task costs: the claims (leases) per document, on SQLite and PostgreSQL.

Two measurements, each side by side in one run, on a fresh results database per pass:

1. *The statements alone*: N claims (``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING``),
   one renewal of all N, and N releases — the milliseconds per document.
2. *Within the batch engine* (``Analyser`` + ``run_batch``, no Dagster), N documents against the
   bundled simulator with no latency, so that the bookkeeping is all there is: once as shipped,
   once with the claims replaced by a stand-in that takes and releases nothing. The ratio of the
   two wall times is what the claims add to a document's bookkeeping.

    python benchmarks/claims.py [--documents 300] [--backends sqlite,postgres]
                                [--pg-admin-url postgresql://postgres@127.0.0.1:5432/postgres]
                                [--json]

PostgreSQL passes create a database of their own and drop it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ai_pipeline.batch import run_batch  # noqa: E402
from ai_pipeline.claims import Claims  # noqa: E402
from ai_pipeline.documents import parse_document  # noqa: E402
from ai_pipeline.engine import Analyser  # noqa: E402
from ai_pipeline.llm import LLMClient  # noqa: E402
from ai_pipeline.rehearsal.simulator import SimulatorServer  # noqa: E402
from ai_pipeline.retry import Log, NullLog  # noqa: E402
from ai_pipeline.store import Store  # noqa: E402


class NoClaims(Claims):
    """The comparison: a run that takes no claims at all (what the engine did before them)."""

    async def take(self, task_id: str, document_id: str, log: Log, **_: object) -> str | None:
        return None

    def release(self, task_id: str) -> None:
        pass

    def renew(self) -> int:
        return 0


@contextmanager
def database(backend: str, admin_url: str, tmp: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / f'claims-{uuid.uuid4().hex[:8]}.sqlite'}"
        return
    import sqlalchemy as sa

    name = f"aip_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url.replace("postgresql://", "postgresql+psycopg2://"))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from ai_pipeline.store import dispose_stores

        dispose_stores()
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def statements(url: str, n: int) -> dict[str, float]:
    store = Store(url)
    try:
        tasks = [f"{i:020x}-analyse-v1-bench" for i in range(n)]
        t0 = time.perf_counter()
        for i, task in enumerate(tasks):
            assert store.leases.claim(task, f"{i:020x}", "bench-run", 60)
        t1 = time.perf_counter()
        assert store.leases.renew("bench-run", tasks, 60) == n
        t2 = time.perf_counter()
        for task in tasks:
            store.leases.release(task, "bench-run")
        t3 = time.perf_counter()
    finally:
        store.db.dispose()
    return {
        "claim_ms": (t1 - t0) / n * 1000,
        "renew_all_ms": (t2 - t1) * 1000,
        "release_ms": (t3 - t2) / n * 1000,
        "per_document_ms": (t3 - t0) / n * 1000,
    }


def register_sample_documents(store: Store, n: int) -> list[str]:
    """N short documents, each naming the entities the simulator's analysis finds; their ids."""
    ids = []
    for i in range(n):
        text = (
            f"Order {i} for Harbor Supplies was delivered to Lisbon on time. "
            f"Customer Ana Ribeiro praised the excellent packaging of shipment {i}."
        )
        doc = parse_document(text.encode("utf-8"), f"inbox/{i}.txt")
        store.documents.register(doc)
        ids.append(doc.document_id)
    return ids


def engine_pass(url: str, n: int, simulator: SimulatorServer, claims: bool) -> float:
    store = Store(url)
    try:
        ids = register_sample_documents(store, n)
        client = LLMClient(
            base_url=simulator.base_url, api_key="bench", model="sim-analyst-1", max_concurrency=16
        )
        analyser = Analyser(store, client, store.results, log=NullLog(), run_id="bench-run")
        if not claims:
            analyser.claims = NoClaims(store, "bench-run")
        started = time.perf_counter()
        done = sum(1 for _ in run_batch(analyser, ids))
        wall = time.perf_counter() - started
        assert done == n and store.results.count() == n
        return wall
    finally:
        store.db.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get("AI_PIPELINE_BENCH_PG_ADMIN_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres",
    )
    parser.add_argument("--repeat", type=int, default=3, help="engine passes per variant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n = args.documents
    out: dict[str, Any] = {
        "documents": n,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
        },
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer() as simulator:
        for backend in args.backends.split(","):
            with database(backend, args.pg_admin_url, Path(tmp)) as url:
                stmts = statements(url, n)
            walls: dict[str, list[float]] = {"with_claims": [], "without_claims": []}
            for _ in range(args.repeat):
                for variant in ("with_claims", "without_claims"):  # interleaved, side by side
                    with database(backend, args.pg_admin_url, Path(tmp)) as url:
                        walls[variant].append(
                            engine_pass(url, n, simulator, variant == "with_claims")
                        )
            with_c = statistics.median(walls["with_claims"])
            without = statistics.median(walls["without_claims"])
            out["backends"][backend] = {
                "statements": stmts,
                "engine_seconds_median": {"with_claims": with_c, "without_claims": without},
                "engine_ms_per_document": {
                    "with_claims": with_c / n * 1000,
                    "without_claims": without / n * 1000,
                },
                "ratio_with_to_without": with_c / without,
            }
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{n} documents; load {out['machine']['loadavg']}")
        for backend, r in out["backends"].items():
            s = r["statements"]
            e = r["engine_ms_per_document"]
            print(
                f"{backend:9} claim {s['claim_ms']:.2f} ms + release {s['release_ms']:.2f} ms per "
                f"document (renewing all {n}: {s['renew_all_ms']:.1f} ms); engine "
                f"{e['with_claims']:.2f} ms/document with claims, {e['without_claims']:.2f} "
                f"without: ratio {r['ratio_with_to_without']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
