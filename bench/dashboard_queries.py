"""Each dashboard page's queries over a million stored events: median time per page load.

    python bench/dashboard_queries.py [--events N] [--runs R]

Fills a fresh store with N synthetic events the way `bench/queries.py` does (a week of traffic from
200 producers, every event type, dead letters, chain breaks, offsets), opens it read-only as
`callgate dashboard --db` does, and runs each page's loader from `dashboard.data` (the very queries
the page runs, uncached: the first view of a page) R times for each window. Prints the median and
slowest load per page, its queries, and the ratio to the 1 s target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from figures import report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from queries import fill

from consumers.reader import FileReader
from dashboard.data import (
    BlockedFilters,
    Window,
    load_blocked,
    load_call,
    load_coverage,
    load_impact,
    load_overview,
    load_pipeline,
    load_shadow_calls,
    load_trends,
)

TARGET_S = 1.0


class CountingQuery:
    """A `Query` over a reader that counts the queries a page load runs."""

    def __init__(self, reader: FileReader) -> None:
        self.reader = reader
        self.calls = 0

    def __call__(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.calls += 1
        return self.reader.query(name, params).rows


def pages(query: CountingQuery, reader: FileReader, window: Window) -> dict[str, Callable[[], object]]:
    return {
        "overview": lambda: load_overview(query, window),
        "overview, one tenant": lambda: load_overview(query, window, "tenant-7"),
        "blocked attempts": lambda: load_blocked(query, BlockedFilters(since=_since(window))),
        "blocked, filtered, page 50": lambda: load_blocked(
            query, BlockedFilters(since=_since(window), decided_by="policy", text="over the limit"), page=50
        ),
        "call detail": lambda: load_call(query, "call-123456"),
        "trends": lambda: load_trends(query, window),
        "policy impact": lambda: policy_impact(query, window),
        # What the page runs: the four checks and the signed check's queries.
        "coverage": lambda: load_coverage(reader, window.since),
        "pipeline health": lambda: load_pipeline(query),
    }


def policy_impact(query: CountingQuery, window: Window) -> object:
    """The Policy impact page as it first opens: its figures, then the most divergent decider's calls."""
    impact = load_impact(query, window)
    top = impact.deciders[0] if impact.deciders else None
    name, rule = (top.name, top.rule) if top is not None else (None, None)
    return load_shadow_calls(query, window, impact, decider=name, rule=rule, divergent_only=True)


def _since(window: Window) -> str | None:
    return window.since.isoformat() if window.since is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic events to store")
    parser.add_argument("--runs", type=int, default=5, help="timed page loads per page and window")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "audit.duckdb"
        started = time.perf_counter()
        fill(path, options.events)
        print(f"filled {options.events:,} synthetic events in {time.perf_counter() - started:.1f} s")
        reader = FileReader(path)
        query = CountingQuery(reader)
        print(f"median of {options.runs} uncached page loads (target: {TARGET_S * 1000:.0f} ms per page)")
        print(f"{'page':<28} {'window':<15} {'queries':>7} {'median ms':>10} {'max ms':>8} {'of target':>10}")
        worst = 0.0
        for label in ("Last 24 hours", "Last 7 days", "All time"):
            window = Window.named(label)
            for page, load in pages(query, reader, window).items():
                times = []
                for run in range(options.runs + 1):  # the first load warms DuckDB's caches, not counted
                    query.calls = 0
                    begun = time.perf_counter()
                    load()
                    if run:
                        times.append(time.perf_counter() - begun)
                median = statistics.median(times)
                worst = max(worst, median)
                calls = query.calls if page != "coverage" else "-"
                print(
                    f"{page:<28} {label:<15} {calls!s:>7} {median * 1000:>10.1f} {max(times) * 1000:>8.1f} "
                    f"{median / TARGET_S:>9.2f}x"
                )
        reader.close()
        print(f"slowest page median: {worst * 1000:.1f} ms ({worst / TARGET_S:.2f}x the target)")
        report("slowest dashboard page", worst * 1000, "ms", target="<= 1,000 ms")


if __name__ == "__main__":
    main()
