"""Counters that count: every load of a policy in a process shares its limits, a Redis shares them
across processes, and concurrent calls never pass a limit together."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from interceptor_core import Gate, RunContext, tool
from interceptor_core.builtins import RedisCounter
from interceptor_core.policy import load_policy

LIMIT = 5


def rate_policy(tmp_path: Path) -> Path:
    """A file limiting refunds to LIMIT an hour per tenant, under a name no other test uses."""
    path = tmp_path / "rate.yaml"
    path.write_text(
        f"version: 1\nname: rate-{uuid.uuid4().hex[:8]}\nrules:\n"
        "  - id: hourly-refunds\n    tools: [refund]\n"
        f"    when: \"count_calls('refund', 'tenant', duration('1h')) > {LIMIT}\"\n"
        "    decision: deny\n"
    )
    return path


@tool
def refund(order_id: str) -> str:
    """Refunds an order."""
    return f"refunded {order_id}"


def burst(scopes: list[object], calls: int) -> list[str]:
    """`calls` refunds at once from as many threads, spread over the scopes; their result kinds."""
    start = threading.Barrier(calls)

    def one(n: int) -> str:
        start.wait()
        scope = scopes[n % len(scopes)]
        result = asyncio.run(scope.call("refund", {"order_id": f"o-{n}"}, run=RunContext(tenant="acme")))  # type: ignore[attr-defined]
        return str(result.kind)

    with ThreadPoolExecutor(calls) as pool:
        return list(pool.map(one, range(calls)))


def test_two_gates_loading_one_file_share_its_limit(tmp_path: Path) -> None:
    """Two gates that each `load_policy()` the file: 10 refunds, LIMIT pass, the rest are denied."""
    path = rate_policy(tmp_path)
    scopes = [Gate(name, interceptors=[load_policy(path)]).agent("a", tools=[refund]) for name in ("g1", "g2")]
    kinds = [
        asyncio.run(scopes[n % 2].call("refund", {"order_id": f"o-{n}"}, run=RunContext(tenant="acme"))).kind
        for n in range(10)
    ]
    assert kinds == ["ok"] * LIMIT + ["denied"] * (10 - LIMIT)


def test_fifty_concurrent_calls_across_two_gates_never_pass_the_limit(tmp_path: Path) -> None:
    """Fifty refunds released at once from fifty threads over two gates: at most LIMIT run (each call is
    counted after it is recorded, so a burst may be denied more than strictly needed, never less)."""
    path = rate_policy(tmp_path)
    scopes = [Gate(name, interceptors=[load_policy(path)]).agent("a", tools=[refund]) for name in ("g1", "g2")]
    kinds = burst(scopes, 50)
    assert len(kinds) == 50
    assert kinds.count("ok") <= LIMIT
    assert kinds.count("ok") + kinds.count("denied") == 50


WORKER = """\
import asyncio, sys, threading
from concurrent.futures import ThreadPoolExecutor
from interceptor_core import Gate, RunContext, tool
from interceptor_core.builtins import RedisCounter
from interceptor_core.policy import load_policy

path, url, prefix, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

@tool
def refund(order_id: str) -> str:
    \"\"\"Refunds an order.\"\"\"
    return "ok"

scopes = [
    Gate(name, interceptors=[load_policy(path, counter=RedisCounter(url, prefix=prefix))]).agent("a", tools=[refund])
    for name in ("g1", "g2")
]
start = threading.Barrier(calls)

def one(n):
    start.wait()
    result = asyncio.run(scopes[n % 2].call("refund", {"order_id": f"{prefix}{n}"}, run=RunContext(tenant="acme")))
    return result.kind

print("ready", flush=True)
sys.stdin.readline()
with ThreadPoolExecutor(calls) as pool:
    print(" ".join(pool.map(one, range(calls))), flush=True)
"""


def test_fifty_concurrent_calls_across_two_processes_never_pass_the_limit(tmp_path: Path, redis_url: str) -> None:
    """Two processes with two gates each over one Redis, 25 threads each, released together: at most
    LIMIT refunds run in all."""
    path = rate_policy(tmp_path)
    prefix = f"test:{uuid.uuid4().hex}:"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), redis_url, prefix, "25"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        kinds: list[str] = []
        for worker in workers:
            out, errors = worker.communicate(timeout=60)
            assert worker.returncode == 0, errors
            kinds += out.split()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert len(kinds) == 50
    assert kinds.count("ok") <= LIMIT
    counter = RedisCounter(redis_url, prefix=prefix)
    try:
        assert counter.count("refund", "tenant", RunContext(tenant="acme"), 3600, 0) == 50
    finally:
        counter.close()
