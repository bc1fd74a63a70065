"""Per-call cost of the call counters (record + count), as ratios to floors measured in the same run.

    python bench/counters.py [--calls N] [--redis-calls M] [--rounds R]

What a rate limit does on every matching call: record it, then count the window. Each path runs
N (or M for Redis) times per round; rounds of all paths alternate, so machine noise hits them
alike; medians of the per-round means are reported.

- InProcessCounter, against a floor of the least a windowed counter can do for one key: one dict
  lookup, a list append and a bisect.
- RedisCounter against a redis-server this script starts on a free loopback port (no
  persistence), against one PING round trip to it: record is one round trip, count one more for
  an exact tool name and two for a glob.

The last lines are the figures; `figures()` returns them as a dict.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import redis
from figures import report

from interceptor_core import RunContext, tool
from interceptor_core.builtins.counters import InProcessCounter, RateLimit, RedisCounter
from interceptor_core.testing import make_call

RUN = RunContext(tenant="acme", principal="u-1")
TOOLS = ("search_web", "search_docs", "fetch", "send_email", "read_file")
WINDOW_S = 60.0


@contextlib.contextmanager
def redis_server(timeout_s: float = 10.0) -> Iterator[str]:
    """A redis-server of our own on a free loopback port, answering PING; its URL. Stopped after.

    The same start as the tests' fixture (tests/interceptor_core/builtins/conftest.py).
    """
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed; run `make venv` (it installs Debian's redis-server)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as workdir:
        command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--daemonize", "no", "--dir", workdir]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            with redis.Redis(port=port, socket_timeout=1) as client:
                while True:
                    if process.poll() is not None:
                        raise SystemExit(f"redis-server exited with {process.returncode}")
                    with contextlib.suppress(redis.exceptions.ConnectionError):
                        if client.ping():
                            break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"redis-server did not answer PING in {timeout_s} s")
                    time.sleep(0.01)  # the poll interval of a deadline loop
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


Path = Callable[[str], Any]


def counter_path(counter: InProcessCounter | RedisCounter, glob: str) -> Path:
    """record + count, as `RateLimit` does them, spreading calls over a few tools."""
    names = itertools.cycle(TOOLS)

    def step(call_id: str) -> None:
        at = time.time()
        counter.record(next(names), RUN, call_id, at)
        counter.count(glob, "tenant", RUN, WINDOW_S, at)

    return step


def floor_path() -> Path:
    buckets: dict[tuple[str, str | None], list[float]] = {("tenant", "acme"): []}

    def step(call_id: str) -> None:
        at = time.time()
        times = buckets[("tenant", RUN.tenant)]
        times.append(at)
        len(times) - bisect.bisect_right(times, at - WINDOW_S)

    return step


def rate_limit_path(counter: InProcessCounter) -> Path:
    """`RateLimit.before_tool_call` on a matching call (never past its limit)."""

    @tool
    def search_web(query: str) -> str:
        """Searches."""
        return query

    limit = RateLimit("search_*", limit=10**9, window_s=WINDOW_S, counter=counter)
    call = make_call(search_web, {"query": "q"}, run=RUN)

    def step(call_id: str) -> None:
        call.call_id = call_id
        limit.before_tool_call(call)

    return step


def ping_path(client: redis.Redis) -> Path:
    def step(call_id: str) -> None:
        client.ping()

    return step


def measure(fn: Path, calls: int) -> float:
    ids = [uuid.uuid4().hex for _ in range(calls)]
    start = time.perf_counter()
    for call_id in ids:
        fn(call_id)
    return (time.perf_counter() - start) / calls


ROWS = {
    "floor": ("floor: dict lookup + append + bisect", "floor"),
    "inproc_exact": ("InProcessCounter record + count(exact)", "floor"),
    "inproc_glob": ("InProcessCounter record + count(glob)", "floor"),
    "rate_limit": ("RateLimit.before_tool_call, in-process", "floor"),
    "ping": ("floor: one redis PING round trip", "ping"),
    "redis_exact": ("RedisCounter record + count(exact)", "ping"),
    "redis_glob": ("RedisCounter record + count(glob)", "ping"),
}


def figures(calls: int = 20000, redis_calls: int = 2000, rounds: int = 9) -> dict[str, dict[str, float]]:
    """Median seconds per call of every path, and its ratio to its floor: {path: {"s": ..., "ratio": ...}}."""
    with redis_server() as url, redis.Redis.from_url(url) as client:
        shared = RedisCounter(client=client, prefix=f"bench:{uuid.uuid4().hex}:")
        paths: dict[str, tuple[Path, int]] = {
            "floor": (floor_path(), calls),
            "inproc_exact": (counter_path(InProcessCounter(), "search_web"), calls),
            "inproc_glob": (counter_path(InProcessCounter(), "search_*"), calls),
            "rate_limit": (rate_limit_path(InProcessCounter()), calls),
            "ping": (ping_path(client), redis_calls),
            "redis_exact": (counter_path(shared, "search_web"), redis_calls),
            "redis_glob": (counter_path(shared, "search_*"), redis_calls),
        }
        for fn, n in paths.values():
            measure(fn, n // 5 or 1)  # warm-up
        samples: dict[str, list[float]] = {key: [] for key in paths}
        for _ in range(rounds):
            for key, (fn, n) in paths.items():
                samples[key].append(measure(fn, n))
    med = {key: statistics.median(values) for key, values in samples.items()}
    return {key: {"s": med[key], "ratio": med[key] / med[ROWS[key][1]]} for key in ROWS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per round, in-process paths")
    parser.add_argument("--redis-calls", type=int, default=2000, help="calls per round, Redis paths")
    parser.add_argument("--rounds", type=int, default=9)
    opts = parser.parse_args(argv)
    found = figures(opts.calls, opts.redis_calls, opts.rounds)
    print(f"{'path':<44} {'median µs/call':>15} {'ratio':>8}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<44} {found[key]['s'] * 1e6:>15.2f} {found[key]['ratio']:>8.2f}  {base}")
    for key, base in (("inproc_glob", "floor"), ("rate_limit", "floor"), ("redis_glob", "ping")):
        report(f"{ROWS[key][0]}", found[key]["s"] * 1e6, "µs/call", floor=found[base]["s"] * 1e6)


if __name__ == "__main__":
    main()
