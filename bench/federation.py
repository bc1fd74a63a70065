"""Latency of the named queries through `callgate serve` over three shards, against one store's read API.

    python bench/federation.py [--events N] [--runs R] [--cache DIR]

1. Fills one store with N synthetic events (bench/queries.py's generator: a week of traffic from 200
   producers, dead letters, chain breaks, offsets), then splits it into three shard stores by producer
   (dead letters and offsets by partition), as three materializers of one group would hold them. With
   `--cache DIR` the four files are kept there and reused by the next run of the same N.
2. Serves each of the four stores with the read API of consumers/api.py, each in a process of its own
   (as materializers run), and `callgate serve`'s app (a FederatedRunner) over the three shards in this
   process.
3. Runs every named query with its default parameters (bench/queries.py's first case; call_detail,
   run_events and inclusion_material with an id that exists) R times through each API: the median per
   query, federated and single, and their ratio. Each answer is checked to carry the same number of rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from figures import report
from queries import fill, query_params

from consumers import QUERIES
from consumers.api import ApiServer, build_app
from consumers.federation import FederatedRunner, Shard
from consumers.metrics import MaterializerMetrics
from consumers.store import AuditStore, connect

SHARDS = 3

# Rows go to the shard of their producer (events, chain breaks) or of their partition (dead letters,
# offsets): the split three materializers of one group make when partitions never move.
SPLIT = {
    "events": "CAST(split_part(producer_id, '-', 2) AS INTEGER) % 3 = $shard",
    "chain_breaks": "CAST(split_part(producer_id, '-', 2) AS INTEGER) % 3 = $shard",
    "dead_letters": "partition % 3 = $shard",
    "kafka_offsets": "partition % 3 = $shard",
}

SERVER = """
import sys
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.metrics import MaterializerMetrics
from consumers.runner import StoreQueryRunner
from consumers.store import AuditStore
store = AuditStore(sys.argv[1], read_only=True)
server = ApiServer(build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(ok=True)))
server.start()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
store.close()
"""


def build(root: Path, n: int) -> tuple[Path, list[Path]]:
    """The single store and the three shards of `n` events under `root` (reused when there)."""
    single = root / f"single-{n}.duckdb"
    shards = [root / f"shard-{n}-{i}.duckdb" for i in range(SHARDS)]
    if single.exists() and all(p.exists() for p in shards):
        print(f"reusing the stores of {n:,} events in {root}")
        return single, shards
    for path in (single, *shards):
        path.unlink(missing_ok=True)
    started = time.perf_counter()
    fill(single, n)
    print(f"filled {n:,} synthetic events in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    for index, path in enumerate(shards):
        AuditStore(path).close()  # migrations
        con = connect(path)
        con.execute(f"ATTACH '{single}' AS source (READ_ONLY)")
        for table, where in SPLIT.items():
            con.execute(f"INSERT INTO {table} SELECT * FROM source.{table} WHERE {where}", {"shard": index})  # noqa: S608
        con.execute("DETACH source")
        con.execute("CHECKPOINT")
        con.close()
    print(f"split into {SHARDS} shards in {time.perf_counter() - started:.1f} s")
    return single, shards


def start_server(path: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        raise SystemExit(f"the read API over {path} did not start")
    return process, url


def cases() -> dict[str, dict[str, Any]]:
    """Each query's default parameters; ids that exist for the lookups."""
    known = query_params(datetime.now(UTC))
    out = {name: dict(known[name][0]) if name in known else {} for name in QUERIES}
    out["call_detail"] = {"call_id": "call-123456"}
    out["run_events"] = {"run_id": "run-1234"}
    out["inclusion_material"] = {"event_id": "evt-123456"}
    return out


def median_ms(client: httpx.Client, name: str, params: dict[str, Any], runs: int) -> tuple[float, int]:
    times = []
    rows = 0
    for attempt in range(runs + 1):  # the first run warms the caches and is not counted
        started = time.perf_counter()
        response = client.get(f"/v1/queries/{name}", params={k: str(v) for k, v in params.items()})
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise SystemExit(f"{name}: {response.status_code} {response.text[:300]}")
        rows = len(response.json()["rows"])
        if attempt:
            times.append(elapsed)
    return statistics.median(times) * 1000, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic events, over all shards")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per query")
    parser.add_argument("--cache", type=Path, help="keep the store files here and reuse them")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = options.cache or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        single, shards = build(root, options.events)
        processes = []
        try:
            for path in (single, *shards):
                processes.append(start_server(path))
            single_url, shard_urls = processes[0][1], [url for _, url in processes[1:]]
            runner = FederatedRunner([Shard(url) for url in shard_urls], timeout_s=120)
            serve = ApiServer(build_app(runner, MaterializerMetrics(), runner.health))
            serve.start()
            try:
                run(single_url, serve.url, options.events, options.runs)
            finally:
                serve.stop()
                runner.close()
        finally:
            for process, _ in processes:
                assert process.stdin is not None
                process.stdin.close()
                process.wait(timeout=30)


def run(single_url: str, serve_url: str, n: int, runs: int) -> None:
    with httpx.Client(base_url=single_url, timeout=120) as one, httpx.Client(base_url=serve_url, timeout=300) as fed:
        print(f"\n{n:,} events; {SHARDS} shards; median of {runs} runs per query")
        print(f"{'query':<24} {'single ms':>10} {'serve ms':>10} {'ratio':>7} {'rows':>6}")
        ratios: dict[str, float] = {}
        slowest = ("", 0.0)
        for name, params in sorted(cases().items()):
            single_ms, single_rows = median_ms(one, name, params, runs)
            serve_ms, serve_rows = median_ms(fed, name, params, runs)
            if serve_rows != single_rows:
                raise SystemExit(f"{name}: serve answered {serve_rows} rows, the single store {single_rows}")
            ratios[name] = serve_ms / single_ms
            slowest = max(slowest, (name, serve_ms), key=lambda item: item[1])
            print(f"{name:<24} {single_ms:>10.1f} {serve_ms:>10.1f} {ratios[name]:>7.2f} {serve_rows:>6}")
        median_ratio = statistics.median(ratios.values())
        print(f"median ratio serve / single store over {len(ratios)} queries: {median_ratio:.2f}")
        print(f"slowest through serve: {slowest[0]} {slowest[1]:.0f} ms")
        report("federated query latency, median over queries (3 shards / 1 store)", median_ratio, "x", target="<= 2")
        report(f"slowest query through serve ({slowest[0]})", slowest[1], "ms", target="<= 3,000 ms")


if __name__ == "__main__":
    main()
