"""A policy file as an interceptor: rules read once, conditions compiled once, decided per call."""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ValidationError

from events.redaction import Redactor
from interceptor_core.builtins.counters import CallCounter, InProcessCounter, shared_counter
from interceptor_core.context import RunContext, ScopePath, ToolCall
from interceptor_core.decisions import (
    Allow,
    Block,
    Decision,
    Deny,
    PolicyDecision,
    RequireApproval,
    Substitute,
)
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.policy import _calls, _cel
from interceptor_core.policy._source import Located, Problem, SourceError, read_yaml
from interceptor_core.policy._template import Template, TemplateError

log = logging.getLogger("callgate.policy")

RuleDecision: TypeAlias = Literal["allow", "deny", "block", "require_approval", "substitute", "rewrite"]
DECISIONS: tuple[RuleDecision, ...] = ("allow", "deny", "block", "require_approval", "substitute", "rewrite")
PRECEDENCE: tuple[RuleDecision, ...] = ("block", "deny", "substitute", "require_approval", "allow")
"""Which decision wins when rules of several kinds match, strongest first."""
FAIL_CLOSED: frozenset[str] = frozenset({"deny", "block", "require_approval"})
_ALLOW = Allow()
"""Rules whose condition counts as matched when it fails at run time."""

_TOP_KEYS = ("version", "name", "description", "mandatory", "mode", "default", "default_message", "rules")
_RULE_KEYS = ("id", "description", "tools", "when", "decision", "message", "set", "result", "mode")
Mode: TypeAlias = Literal["enforce", "shadow"]
MODES: tuple[Mode, ...] = ("enforce", "shadow")
_RULE_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FIELD = re.compile(r"[A-Za-z_]\w*")


class PolicyError(ConfigurationError):
    """A policy file that fails its checks. `problems` lists each one (file, line, rule id, what);
    the message is one line per problem, `FILE:LINE rule-id: what is wrong`."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return self.message


class PolicyEvaluationError(Exception):
    """A rewrite produced arguments the tool does not accept: the call fails closed."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a policy file, as written. `tools` None means every tool."""

    id: str
    decision: RuleDecision
    description: str | None = None
    tools: tuple[str, ...] | None = None
    when: str | None = None
    message: str | None = None
    set: Mapping[str, str] = field(default_factory=dict)
    result: str | None = None
    line: int = 0
    mode: Mode = "enforce"
    """"shadow": evaluated and recorded on every call it applies to, never applied."""

    def applies_to(self, tool: str) -> bool:
        """True when the rule's globs match `tool` (case-sensitive, as tool names are)."""
        return self.tools is None or any(fnmatch.fnmatchcase(tool, glob) for glob in self.tools)


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    when: Any
    sets: tuple[tuple[str, Any], ...]
    result: Any
    message: Template | None
    args_fields: frozenset[str]
    """Argument fields the rule reads without a `has()` guard, and its message names."""
    static: bool
    """The condition reads neither arguments nor time nor counters: a run alone decides it."""
    shadow: bool = False
    """A shadow rule of an enforcing policy: it decides only the call's shadow decision."""
    guarded_fields: frozenset[str] = frozenset()
    """Argument fields the rule reads only behind `has()`: some tool of the rule should have each."""
    count_globs: tuple[str, ...] = ()
    """The tool globs its `count_calls` name as constants."""
    reads: frozenset[str] = frozenset()
    """The variables among `args` and `run` its expressions read: when one holds a value the engine
    cannot hold whole, the rule is not evaluated and fails closed."""


@dataclass(frozen=True, slots=True)
class RuleOutcome:
    """What one rule did for one call (`explain`): matched or not, or why it was not evaluated."""

    rule: Rule
    status: Literal["matched", "not matched", "error", "other tool", "not evaluated"]
    error: str | None = None
    counted_as_match: bool = False


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A policy's decision for one call, with every rule's outcome and the final arguments."""

    decision: Decision
    args: dict[str, Any]
    rewritten: Any
    """The validated arguments after rewrites (the input model's instance), None when none applied."""
    matched: tuple[tuple[str, str], ...]
    outcomes: tuple[RuleOutcome, ...]
    error: str | None
    decided_by: str | None
    """The rule whose decision and message won; None for the default."""
    shadow_decision: Decision | None = None
    """What the call would get with the shadow rules enforced too; None when no shadow rule matched."""
    shadow_matched: tuple[tuple[str, str], ...] = ()
    """The shadow rules that matched, each with its decision (none of them applied)."""
    shadow_decided_by: str | None = None


@dataclass(frozen=True, slots=True)
class _Snapshot:
    name: str
    mandatory: bool
    mode: Mode
    description: str | None
    default: Literal["allow", "deny"]
    default_message: Template | None
    rules: tuple[Rule, ...]
    compiled: tuple[_Compiled, ...]
    version: str
    source: str
    counts: bool
    uses_now: bool
    calls_builtins: bool
    by_tool: dict[str, _Plan] = field(default_factory=dict)
    allowed: PolicyDecision = field(init=False)
    """The decision of a call no rule matched under default allow: one value, built once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", PolicyDecision(_ALLOW, None, self.version, (), None))

    def for_tool(self, tool: str) -> _Plan:
        """The rules that apply to `tool`, split and compiled for deciding; cached per tool."""
        plan = self.by_tool.get(tool)
        if plan is None:
            rules = [c for c in self.compiled if c.rule.applies_to(tool)]
            rewrites = tuple(c for c in rules if c.rule.decision == "rewrite")
            others = tuple(c for c in rules if c.rule.decision != "rewrite")
            plan = _Plan(
                rewrites,
                others,
                _combine(rewrites + others),
                _combine(others),
                all(c.when is not None for c in others),
            )
            self.by_tool[tool] = plan
        return plan


@dataclass(frozen=True, slots=True)
class _Combined:
    """Several conditions as one list expression: one evaluation instead of one per rule. A list
    with a failing element fails whole; the rules are then evaluated one by one."""

    program: Any
    checked: bool
    """Every condition type-checks as bool: the list's elements need no check."""


def _combine(rules: tuple[_Compiled, ...]) -> _Combined | None:
    with_conditions = [c for c in rules if c.when is not None]
    if len(with_conditions) < 2:
        return None
    source = "[" + ", ".join(f"({c.rule.when})" for c in with_conditions) + "]"
    return _Combined(_cel.compile_expression(source), all(c.when.return_type() == _cel.BOOL for c in with_conditions))


def _evaluate_all(combined: _Combined | None, activation: Any) -> list[Any] | None:
    """The bools of every condition, or None when one fails (or is no bool)."""
    if combined is None:
        return None
    # An error's plain value is its message (a str), never a list: no type() round trip needed.
    found = combined.program.eval(activation).plain_value()
    if type(found) is not list:
        return None
    if not combined.checked and not all(type(v) is bool for v in found):
        return None
    return found


@dataclass(frozen=True, slots=True)
class _Plan:
    rewrites: tuple[_Compiled, ...]
    others: tuple[_Compiled, ...]
    everything: _Combined | None
    """The conditions of the rewrites and the others, in that order: right while no rewrite applied."""
    decisions: _Combined | None
    """The conditions of the others alone, for after a rewrite changed the arguments."""
    all_conditional: bool
    """Every other rule has a condition: when none holds, no rule matched."""


def _glob_problem(glob: object) -> str | None:
    if not isinstance(glob, str) or not glob:
        return f"tool glob {glob!r} is not a non-empty string"
    if any(ch.isspace() or not ch.isprintable() for ch in glob):
        return f"tool glob {glob!r} contains whitespace or control characters"
    depth = 0
    index = 0
    while index < len(glob):
        ch = glob[index]
        if ch == "[":
            close = glob.find("]", index + 2 if glob[index + 1 : index + 2] in ("!", "]") else index + 1)
            if close == -1:
                return f"tool glob {glob!r} has a '[' without its ']'"
            index = close
        elif ch == "]" and depth == 0:
            return f"tool glob {glob!r} has a ']' without its '['"
        index += 1
    return None


def _parse(text: str, source: str) -> _Snapshot:
    """Read and check a whole file; `PolicyError` with every problem found."""
    problems: list[Problem] = []

    def problem(line: int | None, rule: str | None, message: str) -> None:
        problems.append(Problem(source, line, rule, message))

    try:
        data = read_yaml(text, source)
    except SourceError as exc:
        raise PolicyError(exc.problems) from None
    if not isinstance(data, Located):
        raise PolicyError([Problem(source, 1, None, "a policy file is a mapping with version, name and rules")])
    for key in data:
        if key not in _TOP_KEYS:
            problem(data.line_of(key), None, f"unknown key {key!r} (a policy has: {', '.join(_TOP_KEYS)})")
    if data.get("version") != 1:
        problem(data.line_of("version"), None, f"version must be 1, got {data.get('version')!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problem(data.line_of("name"), None, "name must be a non-empty string (the interceptor's name)")
        name = "policy"
    mandatory = data.get("mandatory", False)
    if not isinstance(mandatory, bool):
        problem(data.line_of("mandatory"), None, f"mandatory must be true or false, got {mandatory!r}")
        mandatory = False
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        problem(data.line_of("description"), None, "description must be text")
        description = None
    mode = data.get("mode", "enforce")
    if mode not in MODES:
        problem(data.line_of("mode"), None, f"mode must be enforce or shadow, got {mode!r}")
        mode = "enforce"
    default = data.get("default", "allow")
    if default not in ("allow", "deny"):
        problem(data.line_of("default"), None, f"default must be allow or deny, got {default!r}")
        default = "deny"
    default_message: Template | None = None
    raw_default_message = data.get("default_message")
    if raw_default_message is not None:
        if not isinstance(raw_default_message, str):
            problem(data.line_of("default_message"), None, "default_message must be text")
        else:
            try:
                default_message = Template(raw_default_message)
            except TemplateError as exc:
                problem(data.line_of("default_message"), None, f"default_message: {exc}")
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        problem(data.line_of("rules"), None, "rules must be a list of rules")
        raw_rules = []
    rules: list[Rule] = []
    compiled: list[_Compiled] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_rules):
        if not isinstance(raw, Located):
            problem(data.line_of("rules"), None, f"rule {index + 1} is not a mapping")
            continue
        built = _parse_rule(raw, index, seen, problem, mode)
        if built is not None:
            rules.append(built[0])
            compiled.append(built[1])
    if problems:
        raise PolicyError(problems)
    expressions = [e for c in compiled for e in (c.rule.when or "", *c.rule.set.values(), c.rule.result or "") if e]
    return _Snapshot(
        name=str(name),
        mandatory=mandatory,
        mode=mode,
        description=description,
        default=default,
        default_message=default_message,
        rules=tuple(rules),
        compiled=tuple(compiled),
        version=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        source=source,
        counts=any(_cel.uses(expr, "count_calls") for expr in expressions),
        uses_now=any(_cel.uses(expr, "now") for expr in expressions),
        calls_builtins=any(_cel.uses(expr, name) for expr in expressions for name in _cel.FUNCTIONS),
    )


def _parse_rule(
    raw: Located,
    index: int,
    seen: dict[str, int],
    problem: Callable[[int | None, str | None, str], None],
    file_mode: Mode,
) -> tuple[Rule, _Compiled] | None:
    rule_id = raw.get("id")
    label = rule_id if isinstance(rule_id, str) else f"rule {index + 1}"
    failed = False

    def fail(key: str | None, message: str) -> None:
        nonlocal failed
        failed = True
        problem(raw.line_of(key) if key else raw.line, label, message)

    for key in raw:
        if key not in _RULE_KEYS:
            fail(key, f"unknown key {key!r} (a rule has: {', '.join(_RULE_KEYS)})")
    if not isinstance(rule_id, str) or not _RULE_ID.fullmatch(rule_id):
        fail("id", f"id must be kebab-case (lower-case words joined by '-'), got {rule_id!r}")
    elif rule_id in seen:
        fail("id", f"duplicate id {rule_id!r} (first used on line {seen[rule_id]})")
    else:
        seen[rule_id] = raw.line_of("id")
    decision = raw.get("decision")
    if decision not in DECISIONS:
        fail("decision", f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
        decision = None
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        fail("description", "description must be text")
    rule_mode = raw.get("mode", file_mode)
    if rule_mode not in MODES:
        fail("mode", f"mode must be enforce or shadow, got {rule_mode!r}")
    elif file_mode == "shadow" and rule_mode != "shadow":
        fail("mode", "a rule of a shadow policy cannot enforce (the whole file is in shadow mode)")
    tools: tuple[str, ...] | None = None
    if "tools" in raw:
        raw_tools = raw["tools"]
        if isinstance(raw_tools, str):
            raw_tools = [raw_tools]
        if not isinstance(raw_tools, list) or not raw_tools:
            fail("tools", "tools must be a non-empty list of tool names or globs (leave it out for every tool)")
        else:
            for glob in raw_tools:
                if (why := _glob_problem(glob)) is not None:
                    fail("tools", why)
            tools = tuple(str(g) for g in raw_tools)
    args_fields: set[str] = set()
    guarded: set[str] = set()

    def expression(key: str, source: object, *, boolean: bool) -> Any:
        if not isinstance(source, str) or not source.strip():
            fail(key, f"{key} must be a CEL expression (text)")
            return None
        pairs, guards = _cel.references(source)
        guarded.update(guards)
        wrong = _calls.problems(source)
        for why in wrong:
            fail(key, why)
        if wrong:
            return None
        for variable, member in pairs:
            known = _cel.FIELDS[variable]
            if member is None:
                continue
            if variable == "args":
                args_fields.add(member)
            elif known is not None and member not in known:
                fail(key, f"{variable} has no field {member!r} (it has: {', '.join(sorted(known)) or 'none'})")
        try:
            program = _cel.compile_expression(source)
        except _cel.CompileError as exc:
            fail(key, f"CEL does not compile: {exc}")
            return None
        if boolean and program.return_type() not in (_cel.BOOL, _cel.DYN):
            fail(key, f"a condition must give a bool, this gives {program.return_type().name().lower()}")
            return None
        return program

    when_source = raw.get("when")
    when = expression("when", when_source, boolean=True) if "when" in raw else None
    message: Template | None = None
    if "message" in raw:
        if decision in ("allow", "rewrite", "substitute"):
            fail("message", f"a {decision} rule has no message (the model reads nothing from it)")
        elif not isinstance(raw["message"], str):
            fail("message", "message must be text")
        else:
            try:
                message = Template(raw["message"])
                args_fields.update(message.args_fields)
            except TemplateError as exc:
                fail("message", str(exc))
    sets: list[tuple[str, Any]] = []
    raw_set = raw.get("set")
    if decision == "rewrite":
        if not isinstance(raw_set, Located) or not raw_set:
            fail("set", "a rewrite rule needs set: {field: CEL expression, ...}")
        else:
            for name, source in raw_set.items():
                if not _FIELD.fullmatch(name):
                    fail("set", f"set names {name!r}, which is not an argument name")
                    continue
                sets.append((name, expression("set", source, boolean=False)))
    elif raw_set is not None:
        fail("set", "set is only for a rewrite rule")
    result = None
    if decision == "substitute":
        if "result" not in raw:
            fail("result", "a substitute rule needs result: a CEL expression for the tool's output")
        else:
            result = expression("result", raw["result"], boolean=False)
    elif "result" in raw:
        fail("result", "result is only for a substitute rule")
    if failed or decision is None:
        return None
    rule = Rule(
        id=str(rule_id),
        decision=decision,
        description=description,
        tools=tools,
        when=when_source if isinstance(when_source, str) else None,
        message=message.text if message is not None else None,
        set={name: str(raw_set[name]) for name, _ in sets} if isinstance(raw_set, Located) else {},
        result=str(raw["result"]) if result is not None else None,
        line=raw.line,
        mode="shadow" if rule_mode == "shadow" else "enforce",
    )
    static = when is None or not any(
        _cel.uses(rule.when or "", name) for name in ("args", "now", "count_calls", "has_secrets")
    )
    sources = [source for source in (rule.when, *rule.set.values(), rule.result) if source]
    return rule, _Compiled(
        reads=frozenset(name for name in ("args", "run") if any(_cel.uses(source, name) for source in sources)),
        guarded_fields=frozenset(guarded),
        count_globs=tuple(
            glob
            for source in sources
            for call in _calls.calls(source)
            if call.name == "count_calls" and call.args and isinstance(glob := _calls.constant(call.args[0]), str)
        ),
        rule=rule,
        when=when,
        sets=tuple(sets),
        result=result,
        message=message,
        args_fields=frozenset(args_fields - guarded),
        static=static,
        shadow=rule.mode == "shadow" and file_mode == "enforce",
    )


def _run_data(run: RunContext) -> dict[str, Any]:
    return {
        "tenant": run.tenant,
        "principal": run.principal,
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "metadata": dict(run.metadata),
    }


def _scope_data(path: ScopePath | None) -> dict[str, Any]:
    if path is None:
        return {"gate": None, "workflow": None, "agent": None}
    return {"gate": path.gate, "workflow": path.workflow, "agent": path.agent}


def _invalid_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
    return str(exc)


def _model_fields(input_model: type[BaseModel]) -> set[str]:
    fields = set(input_model.model_fields)
    fields.update(f.alias for f in input_model.model_fields.values() if f.alias)
    # A tool built from a JSON Schema (an MCP server's, a framework's) names its arguments there.
    schema = getattr(input_model, "json_schema", None)
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        fields.update(schema["properties"])
    return fields


def _fields_of(spec: type[BaseModel] | Mapping[str, Any]) -> set[str]:
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return _model_fields(spec)
    properties = spec.get("properties")
    return set(properties) if isinstance(properties, Mapping) else set()


def _number_fields(spec: type[BaseModel] | Mapping[str, Any]) -> set[str]:
    """The arguments whose schema allows numbers only (integer or number)."""
    schema = spec.model_json_schema() if isinstance(spec, type) and issubclass(spec, BaseModel) else spec
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return set()
    return {
        name
        for name, prop in properties.items()
        if isinstance(prop, Mapping) and prop.get("type") in ("integer", "number")
    }


_COMPARED = re.compile(
    r"""args\.([A-Za-z_]\w*)\s*(?:==|!=|<=|>=|<|>)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')"""
    r"""|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')\s*(?:==|!=|<=|>=|<|>)\s*args\.([A-Za-z_]\w*)"""
)


def _text_comparisons(rule: Rule) -> list[tuple[str, str]]:
    """(field, text literal) for each `args.field <op> 'text'` of the rule's condition."""
    found = []
    for match in _COMPARED.finditer(rule.when or ""):
        if match.group(1):
            found.append((match.group(1), match.group(2)))
        else:
            found.append((match.group(4), match.group(3)))
    return found


def _unheld(compiled: _Compiled, unheld: dict[str, str | None]) -> str | None:
    """Why the rule cannot be evaluated on these values (it reads one the engine cannot hold)."""
    for name in compiled.reads:
        why = unheld.get(name)
        if why is not None:
            return f"not evaluated: {why}, which the policy engine cannot hold whole"
    return None


def _error_text(value: Any) -> str:
    return str(value.value()).replace("\n", " ")


class Policy:
    """A policy file (YAML, `version: 1`) as an interceptor: it goes anywhere interceptors go.

    Build one with `load_policy(path)` or `Policy.from_text(text)`; both raise `PolicyError` for a
    file that fails its checks. Per call it decides in this order: rewrites first, in file order
    (each validated against the tool's input model); then, on the final arguments, any matching
    `block` wins, else any `deny`, else any `substitute`, else any `require_approval`, else an
    explicit `allow` or the default. The first matching rule of the winning kind, in file order,
    gives the message. A condition that fails at run time counts as matched for deny, block and
    require_approval rules, and as not matched for the others; the trail records why.

    Safe from several threads and tasks: a call decides on the version it started with, and
    `reload()` replaces the whole version at once.
    """

    is_policy = True
    """Marks a policy for the gate's audit (its version goes into `ToolsRegistered`)."""

    def __init__(
        self,
        snapshot: _Snapshot,
        *,
        path: Path | None = None,
        counter: CallCounter | None = None,
        clock: Callable[[], float] = time.time,
        redactor: Redactor | None = None,
        base: str | None = None,
    ) -> None:
        self._snapshot = snapshot
        self.path = path
        if counter is None:
            # One count per policy name in the process, so two gates loading one file share its
            # limits; a clock of the caller's own (tests, replays) keeps a count of its own too.
            counter = shared_counter(snapshot.name) if clock is time.time else InProcessCounter(clock=clock)
        self.counter: CallCounter = counter
        self.clock = clock
        self.redactor = redactor if redactor is not None else Redactor()
        self.base = base
        self._listeners: list[weakref.WeakMethod[Callable[[], None]] | Callable[[], None]] = []
        self._checked: dict[str, type[BaseModel]] = {}
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_context: tuple[RunContext, ScopePath | None, dict[str, Any], dict[str, Any], str | None] | None = (
            None
        )

    # -- building -------------------------------------------------------------------------------

    @classmethod
    def from_text(
        cls,
        text: str,
        source: str = "<text>",
        *,
        counter: CallCounter | None = None,
        clock: Callable[[], float] = time.time,
        redactor: Redactor | None = None,
        base: str | None = None,
    ) -> Policy:
        """A policy from YAML text; `source` names it in errors. Raises `PolicyError`.

        `counter` answers `count_calls` (by default the process's shared count for the policy's
        name, so every gate and every load of the file counts together; a `RedisCounter` shares
        limits between gate processes), `clock` gives `now` and the counters' time, `redactor`
        holds the detectors `has_secrets` uses, `base` is the directory `within` resolves relative
        paths against (the process's working directory by default).
        """
        return cls(_parse(text, source), counter=counter, clock=clock, redactor=redactor, base=base)

    # -- what it is -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The interceptor's name in trails, events and `describe` (the file's `name`)."""
        return self._snapshot.name

    @property
    def mandatory(self) -> bool:
        """As for Python interceptors: no inner scope may exclude it."""
        return self._snapshot.mandatory

    @property
    def mode(self) -> Mode:
        """ "shadow" when the whole file is in shadow mode: the gate records its decisions and
        applies none of them (a rule's own `mode: shadow` is handled inside the policy)."""
        return self._snapshot.mode

    @property
    def version(self) -> str:
        """SHA-256 hex of the file's bytes: which text decided a call."""
        return self._snapshot.version

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules, in file order."""
        return self._snapshot.rules

    @property
    def default(self) -> Literal["allow", "deny"]:
        """What a call that no rule decided gets."""
        return self._snapshot.default

    @property
    def source(self) -> str:
        """Where the policy came from (its path, or the `source` given to `from_text`)."""
        return self._snapshot.source

    @property
    def description(self) -> str | None:
        """The file's description, if any."""
        return self._snapshot.description

    def __repr__(self) -> str:
        return f"Policy({self.name!r}, {len(self.rules)} rules, version {self.version[:12]})"

    # -- the gate's hooks -----------------------------------------------------------------------

    def before_tool_call(self, call: ToolCall) -> PolicyDecision:
        """Decide one call (see the class docstring). Raises only when a rewrite produced
        arguments the tool refuses, or a counter cannot be reached: the gate then fails closed."""
        tool = call.tool
        result = self.evaluate(
            tool.name,
            call.args_model.model_dump(mode="json"),
            call.run,
            call.scope,
            validate=tool.input_model.model_validate,
            call_id=call.call_id,
        )
        if (
            result.decision is _ALLOW
            and result.rewritten is None
            and not result.matched
            and result.error is None
            and result.shadow_decision is None
        ):
            return self._snapshot.allowed
        return PolicyDecision(
            result.decision,
            result.rewritten,
            self._snapshot.version,
            result.matched,
            result.error,
            decided_by=result.decided_by,
            shadow=result.shadow_decision,
            shadow_rules=result.shadow_matched,
            shadow_decided_by=result.shadow_decided_by,
        )

    def check_tool(self, name: str, input_model: type[BaseModel]) -> None:
        """Check the rules that apply to a tool against its input model: a `set` or a message field
        naming an argument the tool does not have, or a condition reading one, is a `PolicyError`.
        Called by the gate when it builds a chain with this policy; remembered, so a reload is
        checked against every tool the policy already serves."""
        with self._lock:
            known = {tool: _model_fields(model) for tool, model in self._checked.items()}
        problems = self._tool_problems(self._snapshot, name, _model_fields(input_model), known)
        if problems:
            raise PolicyError(problems)
        with self._lock:
            self._checked[name] = input_model

    def reads(self, tool: str) -> frozenset[str]:
        """What the rules that apply to `tool` read: `args.<field>`, `run.<field>`, `scope.<field>`,
        `tool`, `now`, and the built-in functions they call (`count_calls`, ...). A replay uses it
        to tell a result that depends on a redacted or unstored value (uncertain) from one that
        does not."""
        found: set[str] = set()
        for compiled in self._snapshot.compiled:
            rule = compiled.rule
            if not rule.applies_to(tool):
                continue
            for source in (rule.when or "", *rule.set.values(), rule.result or ""):
                if not source:
                    continue
                pairs, _ = _cel.references(source)
                found.update(f"{variable}.{member}" if member else variable for variable, member in pairs)
                found.update(name for name in _cel.FUNCTIONS if _cel.uses(source, name))
            if compiled.message is not None:
                found.update(f"args.{name}" for name in compiled.message.args_fields)
        return frozenset(found)

    def problems_for(self, tool: str, fields: set[str]) -> list[Problem]:
        """What `check_tool` would refuse for a tool with these argument names (none: it fits)."""
        return self._tool_problems(self._snapshot, tool, fields)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every reload that changed the version (from the reloading
        thread). A bound method is held weakly, so a gate that is gone is not kept alive."""
        ref: weakref.WeakMethod[Callable[[], None]] | Callable[[], None]
        ref = weakref.WeakMethod(callback) if hasattr(callback, "__self__") else callback
        with self._lock:
            for known in self._listeners:
                target = known() if isinstance(known, weakref.WeakMethod) else known
                if target == callback:
                    return
            self._listeners.append(ref)

    def hides(self, tool: str, run: RunContext, path: ScopePath | None = None) -> bool:
        """True when this policy is mandatory and denies or blocks every call of `tool` for `run`
        whatever the arguments: a rule of the tool that reads no arguments (nor time, nor
        counters) matches for the run. A condition that fails counts as matched (fail closed)."""
        snapshot = self._snapshot
        if not snapshot.mandatory or snapshot.mode == "shadow":
            return False
        rules = [
            c
            for c in snapshot.for_tool(tool).others
            if c.rule.decision in ("deny", "block") and c.static and not c.shadow
        ]
        if not rules:
            return False
        data = {"args": {}, "tool": tool, "run": _run_data(run), "scope": _scope_data(path), "now": datetime.now(UTC)}
        run_unheld = _cel.unfaithful(data["run"], "run") is not None
        token = _cel.current.set(_cel.CallScope(run, self.clock(), None, self.redactor, self.base))
        try:
            activation = _cel.env().Activation(data)
            for compiled in rules:
                if compiled.when is None or (run_unheld and "run" in compiled.reads):
                    return True
                value = compiled.when.eval(activation)
                if value.type() != _cel.BOOL or value.value() is True:
                    return True
        finally:
            _cel.current.reset(token)
        return False

    # -- deciding -------------------------------------------------------------------------------

    def evaluate(
        self,
        tool: str,
        args: Mapping[str, Any],
        run: RunContext,
        scope: ScopePath | None = None,
        *,
        validate: Callable[[dict[str, Any]], Any] | None = None,
        call_id: str | None = None,
        explain: bool = False,
        counter: CallCounter | None = None,
        record: bool = True,
        at: float | None = None,
    ) -> Evaluation:
        """Decide a call of `tool` with `args` (JSON values) for `run`, running no tool.

        `validate` checks rewritten arguments (the tool's input model's `model_validate`; without
        it rewrites are taken as they are). With `explain`, every rule's outcome is listed. The
        call is recorded for `count_calls` (unless `record` is False) in `counter`, by default the
        policy's own. `at` is the time the call is decided at (`now`, the counters' window; default:
        the policy's clock), for replaying a stored call at its own time. Raises
        `PolicyEvaluationError` for a rewrite the tool refuses.
        """
        snapshot = self._snapshot
        plan = snapshot.for_tool(tool)
        rewrites, others = plan.rewrites, plan.others
        at = self.clock() if at is None else at
        counter = counter if counter is not None else self.counter
        if snapshot.counts and record:
            counter.record(tool, run, call_id or run.run_id + ":" + str(at), at)
        # The run's and the scope's values are the same for every call of a run through one
        # scope: kept from the last call (a tuple swapped whole, so safe from several threads).
        last = self._last_context
        if last is not None and last[0] is run and last[1] is scope:
            run_data, scope_data, run_problem = last[2], last[3], last[4]
        else:
            run_data, scope_data = _run_data(run), _scope_data(scope)
            run_problem = _cel.unfaithful(run_data, "run")
            self._last_context = (run, scope, run_data, scope_data, run_problem)
        data: dict[str, Any] = {"args": dict(args), "tool": tool, "run": run_data, "scope": scope_data}
        # What the engine cannot hold whole (a NUL ends its strings) no rule may judge: the rules
        # reading it fail closed instead of deciding on a shortened value.
        unheld = {"args": _cel.unfaithful(data["args"], "args"), "run": run_problem}
        if unheld["args"] is None and run_problem is None:
            unheld = {}
        if snapshot.uses_now:
            data["now"] = datetime.fromtimestamp(at, UTC)
        outcomes: list[RuleOutcome] = []
        errors: list[str] = []
        matched: list[tuple[str, str]] = []
        shadow_matched: list[tuple[str, str]] = []
        token = (
            _cel.current.set(_cel.CallScope(run, at, counter, self.redactor, self.base))
            if snapshot.calls_builtins
            else None
        )
        try:
            env = _cel.ENV if _cel.ENV is not None else _cel.env()
            activation = env.Activation(data)
            rewritten: Any = None
            fast = _evaluate_all(plan.everything, activation) if not unheld else None
            position = 0
            status: bool | None
            error: str | None
            for compiled in rewrites:
                if unheld and (why := _unheld(compiled, unheld)) is not None:
                    status, error = None, why
                elif compiled.when is None:
                    status, error = True, None
                elif fast is not None and rewritten is None:
                    status, error = fast[position], None
                    position += 1
                else:
                    status, error = self._test(compiled, activation)
                if status is True and compiled.shadow:
                    # Evaluated and recorded, never applied: later rules see the enforced arguments.
                    shadow_matched.append((compiled.rule.id, "rewrite"))
                    if explain:
                        outcomes.append(self._outcome(compiled.rule, status, error))
                    continue
                if status is True:
                    new_args = dict(data["args"])
                    for name, program in compiled.sets:
                        value = program.eval(activation)
                        if value.type() == _cel.ERROR:
                            status, error = None, f"set {name}: {_error_text(value)}"
                            break
                        new_args[name] = value.plain_value()
                if status is True:
                    if validate is not None:
                        try:
                            rewritten = validate(new_args)
                        except Exception as exc:
                            raise PolicyEvaluationError(
                                f"rule {compiled.rule.id!r} rewrote the arguments into ones {tool} refuses: "
                                + _invalid_text(exc)
                            ) from None
                        new_args = (
                            rewritten.model_dump(mode="json") if isinstance(rewritten, BaseModel) else dict(new_args)
                        )
                    else:
                        rewritten = new_args
                    data["args"] = new_args
                    if unheld:
                        unheld = {"args": _cel.unfaithful(new_args, "args"), "run": run_problem}
                        unheld = unheld if unheld["args"] is not None or run_problem is not None else {}
                    activation = env.Activation(data)
                    matched.append((compiled.rule.id, "rewrite"))
                if error is not None:
                    errors.append(f"rule {compiled.rule.id}: {error} (not applied)")
                if explain:
                    outcomes.append(self._outcome(compiled.rule, status, error))
            winners: dict[str, _Compiled] = {}
            every: dict[str, _Compiled] = {}
            """The winners with the shadow rules enforced too."""
            results: dict[str, Any] = {}
            if rewritten is not None:
                # The arguments changed: the decisions are taken on the final ones.
                fast, position = (_evaluate_all(plan.decisions, activation) if not unheld else None), 0
            for compiled in () if fast is not None and plan.all_conditional and True not in fast else others:
                rule = compiled.rule
                if unheld and (why := _unheld(compiled, unheld)) is not None:
                    status, error = None, why
                elif compiled.when is None:
                    status, error = True, None
                elif fast is not None:
                    status, error = fast[position], None
                    position += 1
                else:
                    status, error = self._test(compiled, activation)
                counted = False
                if status is None:
                    counted = rule.decision in FAIL_CLOSED
                    errors.append(f"rule {rule.id}: {error} ({'counted as matched' if counted else 'not matched'})")
                if status is True and rule.decision == "substitute" and "substitute" not in every:
                    value = compiled.result.eval(activation)
                    if value.type() == _cel.ERROR:
                        status, error = None, f"result: {_error_text(value)}"
                        errors.append(f"rule {rule.id}: {error} (not matched)")
                    else:
                        results[rule.id] = value.plain_value()
                if status is True or counted:
                    if compiled.shadow:
                        shadow_matched.append((rule.id, rule.decision))
                    else:
                        matched.append((rule.id, rule.decision))
                        winners.setdefault(rule.decision, compiled)
                    every.setdefault(rule.decision, compiled)
                if explain:
                    outcomes.append(self._outcome(rule, status, error, counted))
        finally:
            if token is not None:
                _cel.current.reset(token)
        if explain:
            by_id = {o.rule.id: o for o in outcomes}
            outcomes = [by_id.get(rule.id) or RuleOutcome(rule, "other tool") for rule in snapshot.rules]
        decision, decided_by = self._decide(snapshot, winners, data, tool, results)
        shadow_decision, shadow_decided_by = (
            self._decide(snapshot, every, data, tool, results) if shadow_matched else (None, None)
        )
        return Evaluation(
            decision=decision,
            args=data["args"],
            rewritten=rewritten,
            matched=tuple(matched),
            shadow_decision=shadow_decision,
            shadow_matched=tuple(shadow_matched),
            shadow_decided_by=shadow_decided_by,
            outcomes=tuple(outcomes),
            error="; ".join(errors) if errors else None,
            decided_by=decided_by,
        )

    @staticmethod
    def _test(compiled: _Compiled, activation: Any) -> tuple[bool | None, str | None]:
        if compiled.when is None:
            return True, None
        value = compiled.when.eval(activation)
        kind = value.type()
        if kind == _cel.BOOL:
            return bool(value.value()), None
        if kind == _cel.ERROR:
            return None, f"condition failed: {_error_text(value)}"
        return None, f"condition gave {kind.name().lower()}, not a bool"

    @staticmethod
    def _outcome(rule: Rule, status: bool | None, error: str | None, counted: bool = False) -> RuleOutcome:
        if status is None:
            return RuleOutcome(rule, "error", error, counted)
        return RuleOutcome(rule, "matched" if status else "not matched")

    def _decide(
        self,
        snapshot: _Snapshot,
        winners: dict[str, _Compiled],
        data: dict[str, Any],
        tool: str,
        results: dict[str, Any],
    ) -> tuple[Decision, str | None]:
        if not winners:
            if snapshot.default == "allow":
                return _ALLOW, None
            message = snapshot.default_message.render(data) if snapshot.default_message is not None else None
            return Deny(message or f"The call to {tool} is not allowed by policy {snapshot.name}."), None
        for kind in PRECEDENCE:
            compiled = winners.get(kind)
            if compiled is None:
                continue
            rule = compiled.rule
            text = compiled.message.render(data) if compiled.message is not None else None
            match kind:
                case "block":
                    return Block(text or f"policy {snapshot.name}, rule {rule.id}: the run is stopped"), rule.id
                case "deny":
                    return Deny(
                        text or f"The call to {tool} is not allowed (policy {snapshot.name}, rule {rule.id})."
                    ), (rule.id)
                case "substitute":
                    return Substitute(results.get(rule.id)), rule.id
                case "require_approval":
                    return RequireApproval(text or f"policy {snapshot.name}, rule {rule.id} asks for approval"), rule.id
                case "allow":
                    return Allow(), rule.id
        if snapshot.default == "deny":
            message = snapshot.default_message.render(data) if snapshot.default_message is not None else None
            return Deny(message or f"The call to {tool} is not allowed by policy {snapshot.name}."), None
        return Allow(), None

    # -- checks against tools -------------------------------------------------------------------

    @staticmethod
    def _tool_problems(
        snapshot: _Snapshot, tool: str, fields: set[str], others: Mapping[str, set[str]] | None = None
    ) -> list[Problem]:
        """What the rules applying to `tool` get wrong about its arguments. `others` are the fields
        of the other tools known: `has()` is suggested only for a field one of them has."""
        problems = []
        for compiled in snapshot.compiled:
            rule = compiled.rule
            if not rule.applies_to(tool):
                continue
            for name in rule.set:
                if name not in fields:
                    problems.append(
                        Problem(
                            snapshot.source,
                            rule.line,
                            rule.id,
                            f"set {name!r}: tool {tool} has no such argument (it has: {', '.join(sorted(fields))})",
                        )
                    )
            for name in sorted(compiled.args_fields - fields):
                having = sorted(
                    other
                    for other, known in (others or {}).items()
                    if other != tool and rule.applies_to(other) and name in known
                )
                hint = (
                    f"; tool {having[0]} has it: guard with has(args.{name}) if the rule is meant for both"
                    if having
                    else ""
                )
                problems.append(
                    Problem(
                        snapshot.source,
                        rule.line,
                        rule.id,
                        f"args.{name}: tool {tool} has no such argument (it has: {', '.join(sorted(fields)) or 'none'})"
                        + hint,
                    )
                )
        return problems

    def lint(self, tools: Mapping[str, type[BaseModel] | Mapping[str, Any]]) -> list[Problem]:
        """Every mistake the policy makes about these tools (name -> input model or JSON Schema of the
        arguments), for `callgate policy check --tools`: a field a tool lacks (also behind `has()`
        when no tool of the rule has it), a tool glob or a `count_calls` glob that matches no tool,
        and an argument holding a number compared with text. Empty when it fits."""
        snapshot = self._snapshot
        fields = {name: _fields_of(spec) for name, spec in tools.items()}
        numbers = {name: _number_fields(spec) for name, spec in tools.items()}
        names = ", ".join(sorted(fields)) or "none"
        problems: list[Problem] = []

        def add(rule: Rule, text: str) -> None:
            problems.append(Problem(snapshot.source, rule.line, rule.id, text))

        for compiled in snapshot.compiled:
            rule = compiled.rule
            for glob in rule.tools or ():
                if not any(fnmatch.fnmatchcase(tool, glob) for tool in fields):
                    add(rule, f"tool glob {glob!r} matches no tool (tools: {names})")
            for glob in compiled.count_globs:
                if not any(fnmatch.fnmatchcase(tool, glob) for tool in fields):
                    add(rule, f"count_calls tool glob {glob!r} matches no tool (tools: {names})")
            covered = [tool for tool in fields if rule.applies_to(tool)]
            if not covered:
                continue
            for name in sorted(compiled.guarded_fields):
                if not any(name in fields[tool] for tool in covered):
                    add(
                        rule,
                        f"args.{name}: no tool of this rule has such an argument, so has(args.{name}) is "
                        f"always false (tools: {', '.join(covered)})",
                    )
            for name, literal in _text_comparisons(rule):
                typed = [tool for tool in covered if name in numbers[tool]]
                if typed and all(name in numbers[tool] or name not in fields[tool] for tool in covered):
                    add(rule, f"args.{name} is a number in tool {typed[0]}, compared with the text {literal}")
        for tool in fields:
            problems.extend(self._tool_problems(snapshot, tool, fields[tool], fields))
        return problems

    # -- reloading ------------------------------------------------------------------------------

    def reload(self) -> bool:
        """Read the file again. True when the version changed (listeners are then told, and the
        gates announce their new chains); False when the bytes are the same.

        A file that fails its checks, changes `name` or `mandatory`, or no longer fits a tool the
        policy serves is refused with `PolicyError`, and the policy in force stays.
        """
        if self.path is None:
            raise ConfigurationError(
                f"policy {self.name!r} was built from text, not read from a file: nothing to reload"
            )
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError([Problem(str(self.path), None, None, f"cannot read: {exc}")]) from None
        snapshot = _parse(text, str(self.path))
        current = self._snapshot
        if snapshot.version == current.version:
            return False
        problems = []
        if (snapshot.name, snapshot.mandatory, snapshot.mode) != (current.name, current.mandatory, current.mode):
            problems.append(
                Problem(
                    snapshot.source,
                    1,
                    None,
                    "a reload cannot change name, mandatory or mode (the chains were built with them); restart instead",
                )
            )
        with self._lock:
            checked = dict(self._checked)
        for tool, model in checked.items():
            problems.extend(self._tool_problems(snapshot, tool, _model_fields(model)))
        if problems:
            raise PolicyError(problems)
        self._snapshot = snapshot
        log.info("policy %s reloaded from %s: version %s", snapshot.name, snapshot.source, snapshot.version[:12])
        with self._lock:
            listeners = list(self._listeners)
        for ref in listeners:
            callback = ref() if isinstance(ref, weakref.WeakMethod) else ref
            if callback is None:
                continue
            try:
                callback()
            except Exception:
                log.exception("policy %s: a reload listener failed", snapshot.name)
        return True

    def watch(self, interval_s: float = 1.0) -> None:
        """Reload whenever the file changes (checked every `interval_s` in a daemon thread). A
        change that fails its checks is logged and refused; the policy in force stays."""
        if self.path is None:
            raise ConfigurationError(f"policy {self.name!r} was built from text: there is no file to watch")
        if self._watcher is not None:
            return
        path = self.path

        def stamp() -> tuple[int, int] | None:
            try:
                info = path.stat()
            except OSError:
                return None
            return info.st_mtime_ns, info.st_size

        # Taken here, before the caller can change the file, not when the thread gets to run.
        first = stamp()

        def loop() -> None:
            last = first
            while not self._stop.wait(interval_s):
                now = stamp()
                if now == last or now is None:
                    continue
                last = now
                try:
                    self.reload()
                except PolicyError as exc:
                    log.error("policy %s: the changed file is refused, the policy in force stays:\n%s", self.name, exc)

        self._watcher = threading.Thread(target=loop, name=f"callgate-policy-{self.name}", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        """Stop watching the file (if `watch` was asked); idempotent."""
        self._stop.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join(timeout=5)

    # -- describing -----------------------------------------------------------------------------

    def describe(self, tool: str | None = None) -> dict[str, Any]:
        """The policy as data: name, version, source, default and its rules (those that apply to
        `tool`, when given), for `callgate describe`."""
        return {
            "name": self.name,
            "version": self.version,
            "source": self.source,
            "default": self.default,
            "mandatory": self.mandatory,
            "mode": self.mode,
            "rules": [
                {
                    "id": rule.id,
                    "decision": rule.decision,
                    "tools": list(rule.tools) if rule.tools is not None else ["*"],
                    "when": rule.when,
                    "line": rule.line,
                    "mode": rule.mode,
                }
                for rule in self.rules
                if tool is None or rule.applies_to(tool)
            ],
        }


def load_policy(
    path: str | Path,
    watch: bool = False,
    *,
    counter: CallCounter | None = None,
    clock: Callable[[], float] = time.time,
    redactor: Redactor | None = None,
    base: str | None = None,
    watch_interval_s: float = 1.0,
) -> Policy:
    """Read a policy file; `PolicyError` naming the file, the line and the rule for each problem.

    With `watch`, the policy reloads when the file changes (see `Policy.watch`). The other
    arguments are `Policy.from_text`'s.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([Problem(str(file), None, None, f"cannot read: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError as exc:
        raise PolicyError([Problem(str(file), None, None, f"not UTF-8 text: {exc}")]) from None
    policy = Policy(_parse(text, str(file)), path=file, counter=counter, clock=clock, redactor=redactor, base=base)
    if watch:
        policy.watch(watch_interval_s)
    return policy
