"""The false-positive and detection rates of `has_secrets`, on this checkout's own texts.

The figures come from bench/secrets_rates.py (which prints them with the check's cost); this test
keeps them within their bounds: every hostile case of the corpus refused, and fewer than 1 % of the
paragraphs of the project's docs and of its test literals refused.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "secrets_rates.py"
FALSE_POSITIVE_BOUND = 0.01


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_secrets_rates", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_hostile_case_is_refused_and_few_benign_texts_are(bench: ModuleType) -> None:
    """Detection 100 % on the corpus; false positives under 1 % on the docs and on all benign texts."""
    rates = bench.rates()
    assert rates.missed == ()
    assert rates.detection == 1.0
    assert rates.doc_paragraphs > 300, "the docs were not found"
    assert rates.benign > 1000, "the test literals were not found"
    assert rates.doc_false_positive < FALSE_POSITIVE_BOUND, rates.doc_flagged
    assert rates.false_positive < FALSE_POSITIVE_BOUND, rates.flagged


def test_the_rates_count_what_they_judge(bench: ModuleType) -> None:
    """A judge that refuses everything detects all and flags every benign text; one that refuses
    nothing, the reverse (the rates are not fixed numbers)."""
    everything = bench.rates(judge=lambda value: True)
    assert (everything.detection, everything.false_positive, everything.doc_false_positive) == (1.0, 1.0, 1.0)
    nothing = bench.rates(judge=lambda value: False)
    assert (nothing.detection, nothing.false_positive) == (0.0, 0.0)
    assert len(nothing.missed) == nothing.hostile
