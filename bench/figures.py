"""Headline figures of a benchmark, one machine-readable line each, for `bench/all.py` to gather.

A benchmark prints its own detailed table as it likes, and calls `report` for each figure that
belongs in the summary: the value, and either the floor it is measured against in the same run
(the ratio is then value / floor) or only a target.
"""

from __future__ import annotations

import json

PREFIX = "@figure "


def report(
    name: str,
    value: float,
    unit: str,
    *,
    floor: float | None = None,
    target: str = "",
    higher_is_better: bool = False,
    ratio: float | None = None,
) -> None:
    """Print one figure line (`PREFIX` + JSON); `floor` is the same quantity measured for the floor.
    `ratio` is given when it is not value / floor: the median of the ratios of alternating rounds, where
    `value` and `floor` are the medians of each."""
    if ratio is None:
        ratio = value / floor if floor else None
    line = {
        "name": name,
        "value": value,
        "unit": unit,
        "floor": floor,
        "ratio": ratio,
        "target": target,
        "higher_is_better": higher_is_better,
    }
    print(PREFIX + json.dumps(line), flush=True)
