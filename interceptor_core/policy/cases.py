"""Policy test cases: a YAML file of calls and the decision each must get, run without any tool.

```yaml
cases:
  - name: another tenant's refund is denied
    tool: refund
    args: {order_id: GLOBEX-1, amount_cents: 100}
    run: {tenant: acme, principal: u-1}
    expect: deny            # allow | deny | block | substitute | require_approval
    rule: tenant-orders     # optional: the rule that must decide
```

A case may also give `expect_shadow` (the decision with the policy's shadow rules enforced too,
for a rule being rolled out), `scope` (`gate`, `workflow`, `agent`), `schema` (the tool's input JSON
Schema: rewrites are validated against it and fields checked), `calls` (what `count_calls`
answers in this case, as if that many calls were counted), `message` (text the model's message
must contain) and `args_after` (the arguments after rewrites).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from interceptor_core.context import RunContext, ScopePath
from interceptor_core.decisions import Block, Decision, Deny, RequireApproval, Substitute
from interceptor_core.policy._policy import Evaluation, Policy, PolicyError, PolicyEvaluationError
from interceptor_core.policy._source import Located, Problem, SourceError, read_yaml

EXPECTATIONS = ("allow", "deny", "block", "substitute", "require_approval")
_CASE_KEYS = (
    "name",
    "tool",
    "args",
    "run",
    "scope",
    "expect",
    "expect_shadow",
    "rule",
    "schema",
    "calls",
    "message",
    "args_after",
)
_RUN_KEYS = ("tenant", "principal", "run_id", "thread_id", "metadata")


@dataclass(frozen=True, slots=True)
class Case:
    """One case of a cases file, as written."""

    name: str
    tool: str
    args: dict[str, Any]
    run: RunContext
    expect: str
    scope: ScopePath | None = None
    rule: str | None = None
    schema: dict[str, Any] | None = None
    calls: int | None = None
    message: str | None = None
    args_after: dict[str, Any] | None = None
    expect_shadow: str | None = None
    """What the call gets with the policy's shadow rules enforced too (a rule being rolled out)."""
    source: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case run: passed or not, what was expected against what came, and the rules that matched."""

    case: Case
    passed: bool
    got: str
    decided_by: str | None
    matched: tuple[tuple[str, str], ...]
    message: str | None
    failures: tuple[str, ...] = ()
    error: str | None = None


@dataclass(slots=True)
class _FixedCounter:
    """Answers `count_calls` with a number the case gives; records nothing."""

    answer: int
    recorded: list[str] = field(default_factory=list)
    retention_s: float = float("inf")

    def record(self, tool: str, run: RunContext, call_id: str, at: float) -> None:
        self.recorded.append(call_id)

    def count(self, tool_glob: str, key: str, run: RunContext, window_s: float, at: float) -> int:
        return self.answer


def decision_kind(decision: Decision) -> str:
    """The kind a case expects: the decision's kind ("allow" for an allow)."""
    return decision.kind


def decision_text(decision: Decision) -> str | None:
    """What the model reads (a denial) or the reason (a block or an approval) of a decision."""
    match decision:
        case Deny(message=text) | Block(reason=text) | RequireApproval(reason=text):
            return text
        case Substitute(result=result):
            return repr(result)
        case _:
            return None


def load_cases(path: str | Path) -> list[Case]:
    """Read a cases file; `PolicyError` (file, line, case) for each problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([Problem(str(file), None, None, f"cannot read: {exc.strerror or exc}")]) from None
    return cases_from_text(text, str(file))


def cases_from_text(text: str, source: str = "<cases>") -> list[Case]:
    """Cases from YAML text; `PolicyError` for each problem, every problem at once."""
    try:
        data = read_yaml(text, source)
    except SourceError as exc:
        raise PolicyError(exc.problems) from None
    if not isinstance(data, Located) or not isinstance(data.get("cases"), list):
        raise PolicyError([Problem(source, 1, None, "a cases file is a mapping with a list under cases:")])
    problems: list[Problem] = []
    cases: list[Case] = []
    for index, raw in enumerate(data["cases"]):
        if not isinstance(raw, Located):
            problems.append(Problem(source, data.line_of("cases"), None, f"case {index + 1} is not a mapping"))
            continue
        label = raw.get("name") if isinstance(raw.get("name"), str) else f"case {index + 1}"
        before = len(problems)

        def bad(key: str, message: str, raw: Located = raw, label: Any = label) -> None:
            problems.append(Problem(source, raw.line_of(key), str(label), message))

        for key in raw:
            if key not in _CASE_KEYS:
                bad(key, f"unknown key {key!r} (a case has: {', '.join(_CASE_KEYS)})")
        if not isinstance(raw.get("name"), str):
            bad("name", "name must be text")
        if not isinstance(raw.get("tool"), str):
            bad("tool", "tool must be a tool name")
        args = raw.get("args", {})
        if not isinstance(args, dict):
            bad("args", "args must be a mapping of argument names to values")
        if raw.get("expect") not in EXPECTATIONS:
            bad("expect", f"expect must be one of {', '.join(EXPECTATIONS)}, got {raw.get('expect')!r}")
        if "expect_shadow" in raw and raw["expect_shadow"] not in EXPECTATIONS:
            bad(
                "expect_shadow", f"expect_shadow must be one of {', '.join(EXPECTATIONS)}, got {raw['expect_shadow']!r}"
            )
        run_data = raw.get("run", {})
        run: RunContext | None = None
        if not isinstance(run_data, dict) or any(key not in _RUN_KEYS for key in run_data):
            bad("run", f"run is a mapping of {', '.join(_RUN_KEYS)}")
        else:
            try:
                fields: dict[str, Any] = {str(k): (str(v) if k != "metadata" else v) for k, v in run_data.items()}
                run = RunContext(**fields)
            except Exception as exc:
                bad("run", f"run: {exc}")
        scope_data = raw.get("scope")
        scope: ScopePath | None = None
        if scope_data is not None:
            if not isinstance(scope_data, dict) or any(k not in ("gate", "workflow", "agent") for k in scope_data):
                bad("scope", "scope is a mapping of gate, workflow, agent")
            else:
                scope = ScopePath(
                    str(scope_data.get("gate", "")),
                    scope_data.get("workflow"),
                    scope_data.get("agent"),
                    str(raw.get("tool")),
                )
        schema = raw.get("schema")
        if schema is not None and not isinstance(schema, dict):
            bad("schema", "schema must be a JSON Schema object")
        calls = raw.get("calls")
        if calls is not None and (not isinstance(calls, int) or isinstance(calls, bool) or calls < 0):
            bad("calls", "calls must be a whole number >= 0")
        for key in ("rule", "message"):
            if raw.get(key) is not None and not isinstance(raw.get(key), str):
                bad(key, f"{key} must be text")
        args_after = raw.get("args_after")
        if args_after is not None and not isinstance(args_after, dict):
            bad("args_after", "args_after must be a mapping")
        if len(problems) > before or run is None:
            continue
        cases.append(
            Case(
                name=str(raw["name"]),
                tool=str(raw["tool"]),
                args=_plain(args),
                run=run,
                expect=str(raw["expect"]),
                scope=scope,
                rule=raw.get("rule"),
                schema=_plain(schema) if schema is not None else None,
                calls=calls,
                message=raw.get("message"),
                args_after=_plain(args_after) if args_after is not None else None,
                expect_shadow=raw.get("expect_shadow"),
                source=source,
                line=raw.line,
            )
        )
    if problems:
        raise PolicyError(problems)
    return cases


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def schema_validator(schema: Mapping[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A validator of arguments against a JSON Schema (raises `ValueError` naming the field)."""
    import jsonschema

    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            raise ValueError(
                "; ".join(f"{'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}" for e in errors)
            )
        return args

    return validate


def run_case(policy: Policy, case: Case, tools: Mapping[str, type[BaseModel]] | None = None) -> CaseResult:
    """Run one case against `policy` (no tool runs). `tools` maps tool names to input models; a
    case's own `schema` is used when it gives one. Fields the rules name are checked against the
    tool's arguments first: a mismatch fails the case."""
    validate: Callable[[dict[str, Any]], Any] | None = None
    fields: set[str] | None = None
    model = (tools or {}).get(case.tool)
    if case.schema is not None:
        try:
            validate = schema_validator(case.schema)
        except Exception as exc:
            return _error(case, f"schema is not a valid JSON Schema: {exc}")
        fields = set(case.schema.get("properties", {}))
    elif model is not None:
        validate = model.model_validate
        fields = set(model.model_fields)
    failures: list[str] = []
    if fields is not None:
        for problem in policy.problems_for(case.tool, fields):
            failures.append(str(problem))
    args = case.args
    if model is not None and case.schema is None:
        try:
            args = model.model_validate(args).model_dump(mode="json")
        except Exception as exc:
            return _error(case, f"args are not valid for {case.tool}: {exc}")
    elif validate is not None:
        try:
            validate(dict(args))
        except Exception as exc:
            return _error(case, f"args are not valid for {case.tool}: {exc}")
    counter = _FixedCounter(case.calls if case.calls is not None else 1)
    try:
        evaluation: Evaluation = policy.evaluate(
            case.tool, args, case.run, case.scope, validate=validate, counter=counter, explain=True
        )
    except PolicyEvaluationError as exc:
        return _error(case, str(exc))
    got = decision_kind(evaluation.decision)
    text = decision_text(evaluation.decision)
    if got != case.expect:
        failures.append(f"expected {case.expect}, got {got}")
    if case.rule is not None and evaluation.decided_by != case.rule:
        failures.append(f"expected rule {case.rule} to decide, {evaluation.decided_by or 'the default'} did")
    if case.message is not None and (text is None or case.message not in text):
        failures.append(f"expected the message to contain {case.message!r}, it is {text!r}")
    if case.expect_shadow is not None:
        shadow = evaluation.shadow_decision if evaluation.shadow_decision is not None else evaluation.decision
        if decision_kind(shadow) != case.expect_shadow:
            failures.append(
                f"expected {case.expect_shadow} with the shadow rules enforced, got {decision_kind(shadow)}"
            )
    if case.args_after is not None and evaluation.args != case.args_after:
        failures.append(f"expected args after rewrites {case.args_after}, got {evaluation.args}")
    return CaseResult(
        case=case,
        passed=not failures,
        got=got,
        decided_by=evaluation.decided_by,
        matched=evaluation.matched,
        message=text,
        failures=tuple(failures),
        error=evaluation.error,
    )


def _error(case: Case, why: str) -> CaseResult:
    return CaseResult(case, False, "error", None, (), None, (why,), why)


def run_cases(
    policy: Policy, cases: Sequence[Case], tools: Mapping[str, type[BaseModel]] | None = None
) -> list[CaseResult]:
    """Every case, in order."""
    return [run_case(policy, case, tools) for case in cases]


def to_junit(policy: Policy, results: Sequence[CaseResult]) -> str:
    """A JUnit XML report: one test case per case, a failure naming expected against got."""
    failed = sum(1 for r in results if not r.passed)
    root = ET.Element("testsuites", name="callgate policy test", tests=str(len(results)), failures=str(failed))
    suite = ET.SubElement(
        root, "testsuite", name=f"policy {policy.name}", tests=str(len(results)), failures=str(failed)
    )
    for result in results:
        case = ET.SubElement(suite, "testcase", classname=f"{policy.name}.{result.case.tool}", name=result.case.name)
        if not result.passed:
            failure = ET.SubElement(case, "failure", message="; ".join(result.failures))
            failure.text = describe_result(result)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def describe_result(result: CaseResult) -> str:
    """A failing case in words: where it is, expected against got, the rules that matched."""
    lines = [f"{result.case.source}:{result.case.line} {result.case.name}"]
    lines += [f"  {failure}" for failure in result.failures]
    matched = ", ".join(f"{rule} ({kind})" for rule, kind in result.matched) or "none"
    lines.append(f"  rules matched: {matched}")
    if result.message:
        lines.append(f"  message: {result.message}")
    if result.error and result.error not in result.failures:
        lines.append(f"  errors: {result.error}")
    return "\n".join(lines)
