"""Per-call cost of a policy file against a hand-written Python interceptor with the same rules.

    python bench/policy.py [--calls N] [--rounds R]

Both run as the one interceptor of a gate's agent scope (no sinks), called N times per round;
rounds alternate between the paths, so machine noise hits them alike; medians of the per-round
means are reported, and the ratio policy / Python (target <= 2.0).

- "10 rules": ten rules that all apply to the called tool (a rewrite, tenant, principal, scope,
  metadata, size, amount, plus the built-ins sql_writes, host_in and within); the Python
  interceptor does the same checks with the same built-in functions.
- "10 plain rules": the same without the three built-ins (each replaced by a plain comparison),
  so the ratio shows what CEL itself costs, not what sqlglot or realpath cost in both.

Then each built-in function alone, as it is now against the last revision before its bypasses
were closed (`PREVIOUS`, read from git; skipped outside a clone), on ordinary arguments.

Then `has_secrets`' detection rate on the attack corpus and false-positive rate on the project's
own docs and test texts (`bench/secrets_rates.py`).

Then the CEL engines on PyPI, one compiled condition evaluated in a loop (those installed: the
`bench` extra brings the two that are not dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import time
import timeit
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from figures import report
from pydantic import BaseModel
from secrets_rates import rates as secrets_rates

from interceptor_core import Allow, Block, Deny, Gate, RequireApproval, Rewrite, RunContext, ToolCall, tool
from interceptor_core.builtins import has_secrets, host_in, sql_writes, within
from interceptor_core.policy import Policy


class Act(BaseModel):
    order_id: str
    amount_cents: int
    query: str
    url: str
    path: str
    note: str = ""


@tool
async def act(args: Act) -> str:
    return "done"


RUN = RunContext(tenant="acme", principal="agent-7", metadata={"team": "support"})
ARGS = {
    "order_id": "ACME-42",
    "amount_cents": 1200,
    "query": "select status from orders where id = 42",
    "url": "https://docs.example.com/returns",
    "path": "/srv/data/exports/42.csv",
    "note": "customer asked twice",
}

BUILTIN_CONDITIONS = {
    "sql-writes": ("block", "sql_writes(args.query, 'postgres')"),
    "docs-hosts": ("deny", "!host_in(args.url, ['docs.example.com', '*.help.example.com'])"),
    "data-paths": ("deny", "!within(args.path, ['/srv/data'])"),
}
PLAIN_CONDITIONS = {
    "sql-writes": ("block", "args.query.startsWith('drop')"),
    "docs-hosts": ("deny", "!args.url.startsWith('https://docs.example.com/')"),
    "data-paths": ("deny", "!args.path.startsWith('/srv/data/')"),
}


def policy_text(builtins: bool, mode: str = "enforce") -> str:
    rules = [
        '  - id: upper-ids\n    decision: rewrite\n    when: "args.order_id != args.order_id.upperAscii()"\n'
        '    set: {order_id: "args.order_id.upperAscii()"}\n',
        "  - id: tenant-orders\n    decision: deny\n"
        "    when: \"!args.order_id.startsWith(run.tenant.upperAscii() + '-')\"\n"
        '    message: "Order {args.order_id} is not {run.tenant}\'s."\n',
        "  - id: banned-principals\n    decision: deny\n    when: \"run.principal.startsWith('banned-')\"\n",
        "  - id: desk-only\n    decision: deny\n    when: \"scope.agent != 'desk'\"\n",
        "  - id: frozen-teams\n    decision: block\n"
        "    when: \"'frozen' in run.metadata && run.metadata.frozen == true\"\n",
        '  - id: long-notes\n    decision: deny\n    when: "size(args.note) > 2000"\n',
        '  - id: big-amounts\n    decision: require_approval\n    when: "args.amount_cents > 10000"\n'
        '    message: "over 100.00"\n',
    ]
    for rule_id, (decision, when) in (BUILTIN_CONDITIONS if builtins else PLAIN_CONDITIONS).items():
        rules.append(f'  - id: {rule_id}\n    decision: {decision}\n    when: "{when}"\n')
    return f"version: 1\nname: bench-policy\nmode: {mode}\nrules:\n" + "".join(rules)


class HandWritten:
    """The same ten rules as one Python interceptor (the code a team would write instead)."""

    name = "bench-python"

    def __init__(self, builtins: bool) -> None:
        self.builtins = builtins

    def before_tool_call(self, call: ToolCall) -> Any:
        args, run = call.args, call.run
        order_id = args["order_id"]
        rewritten = order_id != order_id.upper()
        if rewritten:
            order_id = order_id.upper()
        tenant = run.tenant or ""
        if self.builtins:
            if sql_writes(args["query"], dialect="postgres"):
                return Block("sql")
            if not host_in(args["url"], ["docs.example.com", "*.help.example.com"]):
                return Deny("host")
            if not within(args["path"], ["/srv/data"]):
                return Deny("path")
        else:
            if args["query"].startswith("drop"):
                return Block("sql")
            if not args["url"].startswith("https://docs.example.com/"):
                return Deny("host")
            if not args["path"].startswith("/srv/data/"):
                return Deny("path")
        if run.metadata.get("frozen") is True:
            return Block("frozen")
        if not order_id.startswith(tenant.upper() + "-"):
            return Deny(f"Order {order_id} is not {tenant}'s.")
        if (run.principal or "").startswith("banned-"):
            return Deny("banned")
        if call.agent != "desk":
            return Deny("desk only")
        if len(args["note"]) > 2000:
            return Deny("long")
        if args["amount_cents"] > 10000:
            return RequireApproval("over 100.00")
        if rewritten:
            return Rewrite({**args, "order_id": order_id})
        return Allow()


def scope_with(interceptor: object) -> Any:
    gate = Gate("bench", interceptors=[interceptor])
    return gate.agent("desk", tools=[act])


async def measure(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


def caller(scope: Any) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        result = await scope.call("act", ARGS, run=RUN)
        if not result.ok:
            raise SystemExit(f"bench setup is wrong: {result}")
        return result

    return call


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    paths = {
        "policy": caller(scope_with(Policy.from_text(policy_text(True)))),
        "python": caller(scope_with(HandWritten(True))),
        "policy_plain": caller(scope_with(Policy.from_text(policy_text(False)))),
        "shadow_plain": caller(scope_with(Policy.from_text(policy_text(False, "shadow")))),
        "python_plain": caller(scope_with(HandWritten(False))),
        "bare": caller(Gate("bench").agent("desk", tools=[act])),
    }
    for fn in paths.values():
        await measure(fn, calls // 5 or 1)
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(rounds):
        for key, fn in paths.items():
            samples[key].append(await measure(fn, calls))
    return samples


PREVIOUS = "e112c1a"
"""The revision whose built-ins are the ones before the bypass corpus was closed."""
BUILTIN_MODULES = {"within": "paths", "host_in": "urls", "sql_writes": "sql", "has_secrets": "secrets"}
BUILTIN_ARGS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "within": (("/srv/data/exports/42.csv", ["/srv/data"]), {}),
    "host_in": (("https://docs.example.com/returns?page=2", ["docs.example.com", "*.help.example.com"]), {}),
    "sql_writes": (
        ("select status, total from orders where id = 42 and lower(note) like 'x%'",),
        {"dialect": "postgres"},
    ),
    "has_secrets": (({"order_id": "ACME-42", "note": "customer asked twice about the refund of order 42"},), {}),
}


def previous_builtins() -> dict[str, Callable[..., Any]] | str:
    """The built-in functions as they were at PREVIOUS, loaded from git under a private name; or why not."""
    root = Path(__file__).resolve().parent.parent
    functions: dict[str, Callable[..., Any]] = {}
    package = types.ModuleType("_previous_builtins")
    package.__path__ = []
    sys.modules["_previous_builtins"] = package
    for name, module in BUILTIN_MODULES.items():
        try:
            source = subprocess.run(
                ["git", "show", f"{PREVIOUS}:interceptor_core/builtins/{module}.py"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"revision {PREVIOUS} not readable from git ({exc})"
        spec = importlib.util.spec_from_loader(f"_previous_builtins.{module}", loader=None)
        assert spec is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded
        exec(compile(source, f"{PREVIOUS}:{module}.py", "exec"), loaded.__dict__)  # noqa: S102 - our own history
        functions[name] = getattr(loaded, name)
    return functions


def _per_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(lambda: fn(*args, **kwargs), number=number, repeat=3)) / number * 1e6


def builtin_costs(rounds: int, number: int) -> dict[str, tuple[float, float | None]]:
    """µs per call of each built-in now, and at PREVIOUS (None when that cannot be loaded): the median
    of `rounds` alternating rounds of `number` calls."""
    current = {"within": within, "host_in": host_in, "sql_writes": sql_writes, "has_secrets": has_secrets}
    previous = previous_builtins()
    if isinstance(previous, str):
        print(f"  previous built-ins: {previous}")
        previous = {}
    out: dict[str, tuple[float, float | None]] = {}
    for name, fn in current.items():
        args, kwargs = BUILTIN_ARGS[name]
        now: list[float] = []
        before: list[float] = []
        old = previous.get(name)
        for _ in range(rounds):
            now.append(_per_call(fn, args, kwargs, number))
            if old is not None:
                before.append(_per_call(old, args, kwargs, number))
        out[name] = (statistics.median(now), statistics.median(before) if before else None)
    return out


ENGINE_EXPRESSION = "!args.order_id.startsWith(run.tenant + '-') && args.amount_cents > 10000"
ENGINE_DATA = {"args": {"order_id": "ACME-42", "amount_cents": 1200}, "run": {"tenant": "ACME"}}


def large_expression(clauses: int = 40) -> str:
    return " || ".join(
        f"(args.amount_cents > {10000 + i} && args.order_id.startsWith('X{i}-'))" for i in range(clauses)
    )


def engines(number: int) -> dict[str, dict[str, float | str]]:
    """µs per evaluation of a small and a large condition in each CEL engine that is installed."""
    out: dict[str, dict[str, float | str]] = {}

    def time_it(fn: Callable[[], Any], n: int) -> float:
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    try:
        from interceptor_core.policy import _cel

        env = _cel.env()
        small, large = env.compile(ENGINE_EXPRESSION), env.compile(large_expression())
        data = {**ENGINE_DATA, "tool": "t", "scope": {}, "now": __import__("datetime").datetime.now()}

        def cpp(expr: Any) -> Callable[[], Any]:
            return lambda: expr.eval(env.Activation(data)).value()

        out["cel-expr-python (Google C++, used)"] = {
            "small": time_it(cpp(small), number),
            "large": time_it(cpp(large), number),
        }
    except Exception as exc:  # pragma: no cover - reported, not fatal
        out["cel-expr-python (Google C++, used)"] = {"error": str(exc)}
    try:
        import cel as rust_cel

        r_small, r_large = rust_cel.compile(ENGINE_EXPRESSION), rust_cel.compile(large_expression())
        out["common-expression-language (Rust)"] = {
            "small": time_it(lambda: r_small.execute(ENGINE_DATA), number),
            "large": time_it(lambda: r_large.execute(ENGINE_DATA), number),
        }
    except ImportError:
        out["common-expression-language (Rust)"] = {"error": "not installed (pip install '.[bench]')"}
    try:
        import celpy

        py_env = celpy.Environment()
        activation = celpy.json_to_cel(ENGINE_DATA)
        p_small = py_env.program(py_env.compile(ENGINE_EXPRESSION))
        p_large = py_env.program(py_env.compile(large_expression()))
        out["cel-python (pure Python)"] = {
            "small": time_it(lambda: p_small.evaluate(activation), max(number // 50, 20)),
            "large": time_it(lambda: p_large.evaluate(activation), max(number // 500, 5)),
        }
    except ImportError:
        out["cel-python (pure Python)"] = {"error": "not installed (pip install '.[bench]')"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--engine-evals", type=int, default=5000)
    opts = parser.parse_args()
    samples = asyncio.run(run(opts.calls, opts.rounds))
    med = {key: statistics.median(values) * 1e6 for key, values in samples.items()}
    print(f"{'path (µs per call, median of ' + str(opts.rounds) + ' rounds)':<58} {'µs':>8}")
    for key, label in (
        ("bare", "desk.call, no interceptor"),
        ("python", "hand-written Python interceptor, 10 rules"),
        ("policy", "policy file, 10 rules"),
        ("python_plain", "hand-written Python interceptor, 10 plain rules"),
        ("policy_plain", "policy file, 10 plain rules"),
        ("shadow_plain", "the same policy file in shadow mode"),
    ):
        print(f"{label:<58} {med[key]:>8.1f}")
    print(f"ratio policy / Python, 10 rules:       {med['policy'] / med['python']:.2f}  (target <= 2.0)")
    print(f"ratio policy / Python, 10 plain rules: {med['policy_plain'] / med['python_plain']:.2f}")
    print(f"ratio shadow / enforced, 10 plain rules: {med['shadow_plain'] / med['policy_plain']:.2f}  (target: 1)")
    print()
    print(f"built-ins alone, µs per call (median of {opts.rounds} rounds): now against {PREVIOUS}")
    costs = builtin_costs(opts.rounds, max(opts.engine_evals // 25, 20))
    for name, (now, before) in costs.items():
        if before is None:
            print(f"  {name:<14} {now:>9.1f}")
        else:
            print(f"  {name:<14} {now:>9.1f}   before {before:>9.1f}   ratio {now / before:.2f}")
    found = secrets_rates()
    print(
        f"has_secrets: {found.detected} of {found.hostile} hostile corpus values refused "
        f"({found.detection:.1%}); {len(found.flagged)} of {found.benign} benign texts refused "
        f"({found.false_positive:.2%}; bench/secrets_rates.py lists them)"
    )
    print()
    print(f"CEL engines, µs per evaluation (best of 5): small = {ENGINE_EXPRESSION!r}; large = 40 such clauses")
    for engine, figures in engines(opts.engine_evals).items():
        if "error" in figures:
            print(f"  {engine:<40} {figures['error']}")
        else:
            print(f"  {engine:<40} small {figures['small']:>9.1f}   large {figures['large']:>9.1f}")
    report("policy file per call, 10 rules", med["policy"], "µs", floor=med["python"], target="ratio <= 2.0")
    report("policy file per call, 10 plain rules", med["policy_plain"], "µs", floor=med["python_plain"])
    for name, (now, before) in costs.items():
        if before is not None:
            report(f"{name} alone, hardened, against before", now, "µs", floor=before)
    report(
        "the same 10 rules in shadow mode, against enforced",
        med["shadow_plain"],
        "µs",
        floor=med["policy_plain"],
        target="ratio about 1",
    )


if __name__ == "__main__":
    main()
