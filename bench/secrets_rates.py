"""How well `has_secrets` tells secrets from ordinary text, and what it costs.

    python bench/secrets_rates.py [--runs N]

- detection: the share of the bypass corpus's hostile cases
  (tests/interceptor_core/builtins/corpus/has_secrets.yaml, verdict `refuse`) that `has_secrets`
  refuses, judged on the case's arguments as the corpus test does;
- false positives: the share of benign texts it refuses. The benign texts are the project's own:
  each paragraph of README.md and docs/*.md (text between blank lines, a fenced code block one
  paragraph), and each string literal of 20 characters or more in tests/**/*.py, except in the
  tests that are about secrets (test_secrets.py, test_redaction.py, the corpus) and except literals
  in which the redactor's plain detectors already find a secret verbatim (deliberate fixtures: a
  test's AWS key or card number). Texts quoting a well-known example secret (`hunter2`, AWS's
  example key, the 4111... test card, a JWT header, a private key block) are left out, docs
  included, and so are test literals holding NUL or a lone surrogate (hostile inputs of other
  checks, which `has_secrets` refuses by design);
- the same two rates for the plain scan `has_secrets` did before (each string through the
  redactor, nothing normalized, decoded or joined), for comparison;
- cost: the median time of one `has_secrets` call on typical tool arguments (short ids, an
  e-mail, a sentence, a URL, a SQL query) and on a long clean text, beside the plain scan it
  replaced (the redactor's `redact_text` on each string, no normalization, decoding or joining),
  measured in the same run.

`rates()` is what tests/interceptor_core/builtins/test_secrets_rates.py checks; `main()` prints.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from events.redaction import Redactor
from interceptor_core.builtins import has_secrets

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "interceptor_core" / "builtins" / "corpus" / "has_secrets.yaml"
SECRET_TESTS = frozenset({"test_secrets.py", "test_redaction.py", "test_corpus.py", "test_secrets_rates.py"})
MIN_LITERAL = 20
EXAMPLE_SECRETS = re.compile(r"hunter2|AKIAIOSFODNN7EXAMPLE|4111[ -]?1111[ -]?1111[ -]?1111|eyJhbGci|PRIVATE KEY")
"""The well-known example secrets that docs and tests quote on purpose: a text quoting one is no
benign text (the check is right to refuse it), so it is left out of the benign corpus."""
UNREADABLE = re.compile("[\x00\ud800-\udfff]")

TYPICAL_ARGS: dict[str, Any] = {
    "order_id": "ACME-42",
    "to": "ops@example.com",
    "subject": "Refund for order 1234",
    "body": "Hello Alice, your refund of 42.50 EUR for order 1234 was sent on 2026-11-03. Regards, the desk",
    "url": "https://docs.example.com/returns?lang=en&page=2",
    "query": "select status, total from orders where id = 42",
    "amount_cents": 4250,
    "tags": ["refund", "priority"],
}
LONG_TEXT = " ".join(["The quick brown fox jumps over the lazy dog near order 1234."] * 160)


@dataclass(frozen=True)
class Rates:
    """Detection on the hostile corpus and false positives on the benign texts."""

    hostile: int
    detected: int
    missed: tuple[str, ...]
    benign: int
    flagged: tuple[str, ...]
    doc_paragraphs: int
    doc_flagged: tuple[str, ...]

    @property
    def detection(self) -> float:
        return self.detected / self.hostile

    @property
    def false_positive(self) -> float:
        return len(self.flagged) / self.benign

    @property
    def doc_false_positive(self) -> float:
        return len(self.doc_flagged) / self.doc_paragraphs


def hostile_cases(corpus: Path = CORPUS) -> list[tuple[str, dict[str, Any], bool]]:
    """(id, arguments, must refuse) for each case of the corpus."""
    data = yaml.safe_load(corpus.read_text(encoding="utf-8"))
    return [
        (str(case["id"]), case["args"] if "args" in case else {"value": case["value"]}, case["verdict"] == "refuse")
        for case in data["cases"]
    ]


_FENCE = re.compile(r"^\s*(```|~~~)")


def doc_paragraphs(root: Path = ROOT) -> list[str]:
    """Each paragraph of README.md and docs/*.md (text between blank lines, a fenced block as one),
    but those quoting a well-known example secret."""
    paragraphs: list[str] = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        current: list[str] = []
        fenced = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if _FENCE.match(line):
                fenced = not fenced
            if not line.strip() and not fenced:
                if current:
                    paragraphs.append("\n".join(current))
                current = []
            else:
                current.append(line)
        if current:
            paragraphs.append("\n".join(current))
    return [text for text in paragraphs if not EXAMPLE_SECRETS.search(text)]


def literals_of_tests(root: Path = ROOT) -> list[str]:
    """String literals of 20+ characters in the tests that are not about secrets, fixtures left out."""
    plain = Redactor()
    literals: list[str] = []
    for path in sorted((root / "tests").rglob("*.py")):
        if path.name in SECRET_TESTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) >= MIN_LITERAL:
                text = node.value
                if not (plain.detector_spans(text) or EXAMPLE_SECRETS.search(text) or UNREADABLE.search(text)):
                    literals.append(text)
    return literals


def rates(root: Path = ROOT, judge: Callable[[Any], bool] = has_secrets) -> Rates:
    """Detection and false-positive rates of `judge` on this checkout's corpus, docs and tests."""
    cases = hostile_cases(root / CORPUS.relative_to(ROOT))
    hostile = [(name, args) for name, args, refuse in cases if refuse]
    missed = tuple(name for name, args in hostile if not judge(args))
    paragraphs = doc_paragraphs(root)
    benign_cases = [args for _, args, refuse in cases if not refuse]
    doc_flagged = tuple(text for text in paragraphs if judge(text))
    others = [*literals_of_tests(root), *benign_cases]
    flagged = doc_flagged + tuple(repr(value) for value in others if judge(value))
    return Rates(
        hostile=len(hostile),
        detected=len(hostile) - len(missed),
        missed=missed,
        benign=len(paragraphs) + len(others),
        flagged=flagged,
        doc_paragraphs=len(paragraphs),
        doc_flagged=doc_flagged,
    )


def plain_scan(value: Any) -> bool:
    """The scan `has_secrets` did before it normalized, decoded and joined: the redactor on each string."""
    redactor = _plain()
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if redactor.redact_text(item) != item:
                return True
        elif isinstance(item, dict):
            for key, inner in item.items():
                if redactor.redact_text(key) != key:
                    return True
                pending.append(inner)
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 10**7:
            pending.append(str(item))
    return False


_PLAIN: list[Redactor] = []


def _plain() -> Redactor:
    if not _PLAIN:
        _PLAIN.append(Redactor())
    return _PLAIN[0]


def median_seconds(fn: Callable[[], object], runs: int, batch: int = 50) -> float:
    """The median over `runs` rounds of the mean time of one call in a batch of `batch` calls."""
    fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch)
    return statistics.median(samples)


def timings(runs: int) -> dict[str, tuple[float, float]]:
    """Per value: (has_secrets, plain scan) median seconds per call, rounds alternating."""
    values = {"typical arguments": TYPICAL_ARGS, "long clean text (9.6 kB)": {"body": LONG_TEXT}}
    result = {}
    for name, value in values.items():
        new: list[float] = []
        old: list[float] = []
        for _ in range(5):
            new.append(median_seconds(lambda value=value: has_secrets(value), runs))
            old.append(median_seconds(lambda value=value: plain_scan(value), runs))
        result[name] = (statistics.median(new), statistics.median(old))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="fewer runs, for a smoke run")
    options = parser.parse_args()
    runs = 5 if options.quick else options.runs

    from figures import report  # bench/ is on the path when run as a script

    found = rates()
    print(f"hostile corpus: {found.detected}/{found.hostile} refused ({found.detection:.1%})")
    for name in found.missed:
        print(f"  missed: {name}")
    print(
        f"benign texts: {len(found.flagged)}/{found.benign} refused ({found.false_positive:.2%}); "
        f"doc paragraphs: {len(found.doc_flagged)}/{found.doc_paragraphs} ({found.doc_false_positive:.2%})"
    )
    for text in found.flagged:
        print(f"  flagged: {text[:160]!r}")
    before = rates(judge=plain_scan)
    print(
        f"the plain scan (each string through the redactor, as has_secrets did before): "
        f"{before.detected}/{before.hostile} hostile refused ({before.detection:.1%}), "
        f"{len(before.flagged)}/{before.benign} benign refused ({before.false_positive:.2%}; "
        f"doc paragraphs {len(before.doc_flagged)}/{before.doc_paragraphs})"
    )
    report("has_secrets detection (hostile corpus)", found.detection * 100, "%", target="100", higher_is_better=True)
    report("has_secrets false positives (docs, tests)", found.false_positive * 100, "%", target="< 1")
    for name, (new, old) in timings(runs).items():
        print(f"{name}: has_secrets {new * 1e6:.1f} µs, plain scan {old * 1e6:.1f} µs ({new / old:.1f}x)")
        report(f"has_secrets, {name}", new * 1e6, "µs", floor=old * 1e6)


if __name__ == "__main__":
    main()
