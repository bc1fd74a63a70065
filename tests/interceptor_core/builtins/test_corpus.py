"""The bypass corpus: every hostile input of `corpus/*.yaml`, through both routes of its built-in.

Each corpus file names a built-in, the constant arguments its check is configured with, and cases:
a value the model sends, and the verdict it must get (`refuse`: the tool body must not run; `pass`:
it must run). Every case runs three ways, which must all give its verdict: the plain function, a
`Gate` with the Python interceptor, and a `Gate` with a policy file calling the built-in. Each gate
calls a real tool that records whether its body ran. The corpus only grows: an input that once got
through stays here with the verdict it must get.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from interceptor_core import Gate, Interceptor, tool
from interceptor_core.builtins import (
    HostAllowList,
    NoSecrets,
    PathsWithin,
    ReadOnlySQL,
    has_secrets,
    host_in,
    sql_writes,
    within,
)
from interceptor_core.policy import Policy

CORPUS = Path(__file__).parent / "corpus"
VERDICTS = ("refuse", "pass")
ARG_FIELDS = ("value", "other")
"""The argument names a case may use (`other`: a second field, for checks that read several)."""


@dataclass(frozen=True)
class Case:
    builtin: str
    config: dict[str, Any]
    id: str
    args: dict[str, Any]
    verdict: str

    def __str__(self) -> str:
        return f"{self.builtin}:{self.id}"


def _load() -> list[Case]:
    cases: list[Case] = []
    for file in sorted(CORPUS.glob("*.yaml")):
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
        builtin = data["builtin"]
        if builtin not in ROUTES:
            raise ValueError(f"{file.name}: unknown built-in {builtin!r}")
        seen: set[str] = set()
        for entry in data["cases"]:
            if entry["id"] in seen:
                raise ValueError(f"{file.name}: duplicate case id {entry['id']!r}")
            seen.add(entry["id"])
            if entry["verdict"] not in VERDICTS:
                raise ValueError(f"{file.name}: case {entry['id']!r} has verdict {entry['verdict']!r}")
            args = entry["args"] if "args" in entry else {"value": entry["value"]}
            if set(args) - set(ARG_FIELDS):
                raise ValueError(f"{file.name}: case {entry['id']!r} uses fields other than {ARG_FIELDS}")
            cases.append(Case(builtin, dict(data.get("config") or {}), str(entry["id"]), args, entry["verdict"]))
    return cases


def _fill(value: Any, root: str) -> Any:
    """`{root}` in any string of a case becomes the test's real directory tree."""
    if isinstance(value, str):
        return value.replace("{root}", root)
    if isinstance(value, list):
        return [_fill(item, root) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, root) for key, item in value.items()}
    return value


def _cel(value: Any) -> str:
    """A constant as a CEL literal (JSON's string escapes are CEL's)."""
    return json.dumps(value, ensure_ascii=True)


@dataclass(frozen=True)
class Route:
    function: Callable[[dict[str, Any], dict[str, Any]], bool]
    """The plain function's verdict on the case's arguments: True when it refuses them."""
    interceptor: Callable[[dict[str, Any]], Interceptor]
    condition: Callable[[dict[str, Any]], str]
    """The policy's deny condition (CEL)."""


def _values(args: dict[str, Any]) -> list[Any]:
    return [args[name] for name in ARG_FIELDS if name in args]


ROUTES: dict[str, Route] = {
    "within": Route(
        function=lambda args, c: not within(args["value"], c["roots"]),
        interceptor=lambda c: PathsWithin("value", c["roots"]),
        condition=lambda c: f"!within(args.value, {_cel(c['roots'])})",
    ),
    "host_in": Route(
        function=lambda args, c: not host_in(args["value"], c["hosts"]),
        interceptor=lambda c: HostAllowList("value", c["hosts"]),
        condition=lambda c: f"!host_in(args.value, {_cel(c['hosts'])})",
    ),
    "sql_writes": Route(
        function=lambda args, c: sql_writes(args["value"], dialect=c.get("dialect")),
        interceptor=lambda c: ReadOnlySQL("value", dialect=c.get("dialect")),
        condition=lambda c: (
            f"sql_writes(args.value, {_cel(c['dialect'])})" if c.get("dialect") else "sql_writes(args.value)"
        ),
    ),
    "has_secrets": Route(
        function=lambda args, c: has_secrets(args),
        interceptor=lambda c: NoSecrets(),
        condition=lambda c: "has_secrets(args)",
    ),
}

CASES = _load()


def _policy(case: Case, config: dict[str, Any]) -> Policy:
    text = (
        "version: 1\nname: corpus\nrules:\n  - id: check\n    decision: deny\n"
        f"    when: {json.dumps(ROUTES[case.builtin].condition(config))}\n"
    )
    return Policy.from_text(text, source=f"corpus:{case}")


def _tool(ran: list[dict[str, Any]]) -> Any:
    @tool
    def act(value: Any = None, other: Any = None) -> str:
        """Acts on its arguments (records that its body ran, with what it received)."""
        ran.append({"value": value, "other": other})
        return "done"

    return act


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real tree for path cases: {root}/data (the allowed root) with a file and a link out of it."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("corpus")))
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "notes.txt").write_text("ok")
    (root / "precious.txt").write_text("secret")
    (root / "data" / "escape").symlink_to(root / "precious.txt")
    return str(root)


def test_the_corpus_holds_both_verdicts_for_each_built_in() -> None:
    """Each built-in has hostile inputs it must refuse and ordinary ones it must let through."""
    for builtin in ROUTES:
        verdicts = {case.verdict for case in CASES if case.builtin == builtin}
        assert verdicts == set(VERDICTS), f"{builtin}: the corpus has only {verdicts}"


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_every_route_gives_the_case_its_verdict(case: Case, tree: str) -> None:
    """The plain function, the Python interceptor and the policy file all refuse (tool body not run)
    or all pass (tool body run once, with exactly the arguments that were judged)."""
    route = ROUTES[case.builtin]
    config = _fill(case.config, tree)
    args = _fill(case.args, tree)
    refuse = case.verdict == "refuse"
    assert route.function(args, config) is refuse, "plain function"
    for name, interceptor in (("interceptor", route.interceptor(config)), ("policy", _policy(case, config))):
        ran: list[dict[str, Any]] = []
        desk = Gate("corpus", interceptors=[interceptor]).agent("a", tools=[_tool(ran)])
        result = await desk.call("act", args)
        if refuse:
            assert result.kind == "denied", f"{name}: {result.kind} {result.message}"
            assert ran == [], name
        else:
            assert result.kind == "ok", f"{name}: {result.kind} {result.message}"
            assert ran == [{"value": args.get("value"), "other": args.get("other")}], name
