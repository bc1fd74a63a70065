"""`callgate policy check|test|explain`: lint, test and explain policy files without running a tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(
    name="policy",
    help="Check, test and explain policy files (no tool runs).",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2


def _tool_models(spec: str | None) -> dict[str, Any]:
    """Input models by tool name from `MODULE:ATTR`: a Tool, a list of them, an agent scope or a
    gate (every scope's tools), or a function returning one of those."""
    if spec is None:
        return {}
    from callgate.loading import load_object
    from interceptor_core import AgentScope, Gate, Tool

    obj = load_object(spec)
    if callable(obj) and not isinstance(obj, Tool | Gate | AgentScope):
        obj = obj()
    if isinstance(obj, Gate):
        tools = [t for scope in obj._agents for t in scope.tools.values()]
    elif isinstance(obj, AgentScope):
        tools = list(obj.tools.values())
    elif isinstance(obj, Tool):
        tools = [obj]
    elif isinstance(obj, list | tuple) and all(isinstance(t, Tool) for t in obj):
        tools = list(obj)
    else:
        raise typer.BadParameter(f"{spec} is a {type(obj).__name__}, not tools, an agent scope or a gate")
    return {t.name: t.input_model for t in tools}


def _tool_specs(spec: str | None) -> dict[str, Any]:
    """Input models or JSON Schemas by tool name: `MODULE:ATTR` (see `_tool_models`), or a tools
    manifest, a JSON or YAML file listing `{name, inputSchema}` objects, alone or under `tools`
    (the shape of an MCP server's `tools/list` answer)."""
    if spec is None or not spec.endswith((".json", ".yaml", ".yml")):
        return _tool_models(spec)
    import yaml

    path = Path(spec)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read the tools manifest {spec}: {exc}") from None
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise typer.BadParameter(f"{spec}: a tools manifest is a list of {{name, inputSchema}} (or one under 'tools')")
    found: dict[str, Any] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        schema = entry.get("inputSchema", entry.get("input_schema", {})) if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise typer.BadParameter(f"{spec}: tool {index + 1} needs a name and an inputSchema object")
        found[name] = schema
    return found


def _load(path: Path) -> Any:
    from interceptor_core.policy import PolicyError, load_policy

    try:
        return load_policy(path)
    except PolicyError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from None


@app.command()
def check(
    files: Annotated[list[Path], typer.Argument(help="Policy files.")],
    tools: Annotated[
        str | None,
        typer.Option(
            help="The tools: MODULE:ATTR (tools, a scope or a gate) or a manifest FILE.json|.yaml of "
            "{name, inputSchema}; fields, tool globs and count_calls globs are then checked against them."
        ),
    ] = None,
) -> None:
    """Exit 0 with one line per file (rules, version), or 2 with FILE:LINE rule-id: what is wrong."""
    from interceptor_core.policy import PolicyError, load_policy

    models = _tool_specs(tools)
    failed = False
    for file in files:
        try:
            policy = load_policy(file)
        except PolicyError as exc:
            failed = True
            for problem in exc.problems:
                err.print(str(problem), markup=False)
            continue
        problems = policy.lint(models) if models else []
        if problems:
            failed = True
            for problem in problems:
                err.print(str(problem), markup=False)
            continue
        console.print(
            f"{file}: ok, policy {policy.name}, {len(policy.rules)} rules, default {policy.default}, "
            f"version {policy.version}",
            markup=False,
        )
    if failed:
        raise typer.Exit(EXIT_CANNOT_RUN)


@app.command("test")
def run_tests(
    policy_file: Annotated[Path, typer.Argument(metavar="POLICY", help="The policy file.")],
    cases_files: Annotated[list[Path], typer.Argument(metavar="CASES...", help="Cases files.")],
    tools: Annotated[
        str | None, typer.Option(help="MODULE:ATTR of the tools (or a scope or gate): rewrites and fields checked.")
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here.")] = None,
) -> None:
    """Run cases without running any tool: exit 0 all pass, 1 with each failure, 2 when it cannot run."""
    from interceptor_core.policy import PolicyError
    from interceptor_core.policy.cases import describe_result, load_cases, run_cases, to_junit

    policy = _load(policy_file)
    models = _tool_models(tools)
    cases = []
    for file in cases_files:
        try:
            cases += load_cases(file)
        except PolicyError as exc:
            for problem in exc.problems:
                err.print(str(problem), markup=False)
            raise typer.Exit(EXIT_CANNOT_RUN) from None
    if not cases:
        err.print("no cases to run: a test with no cases proves nothing", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN)
    results = run_cases(policy, cases, models)
    failed = [r for r in results if not r.passed]
    for result in results:
        mark = "[green]pass[/green]" if result.passed else "[red]FAIL[/red]"
        decided = result.decided_by or "default"
        console.print(f"{mark} {escape(result.case.name)}  [dim]{result.got} by {escape(decided)}[/dim]")
    for result in failed:
        console.print(describe_result(result), markup=False)
    if junit is not None:
        junit.write_text(to_junit(policy, results), encoding="utf-8")
        console.print(f"JUnit report: {junit}", markup=False)
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed ({policy.name} {policy.version[:12]})")
    if failed:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def explain(
    policy_file: Annotated[Path, typer.Argument(metavar="POLICY", help="The policy file.")],
    tool: Annotated[str, typer.Option("--tool", help="The tool called.")],
    args: Annotated[str, typer.Option("--args", help="The arguments, as a JSON object.")] = "{}",
    tenant: Annotated[str | None, typer.Option(help="The run's tenant.")] = None,
    principal: Annotated[str | None, typer.Option(help="The run's principal.")] = None,
    tools: Annotated[str | None, typer.Option(help="MODULE:ATTR of the tools: rewrites are validated.")] = None,
) -> None:
    """Every rule, matched or not, and the decision, for one call (no tool runs)."""
    from interceptor_core import RunContext
    from interceptor_core.policy import PolicyEvaluationError
    from interceptor_core.policy.cases import decision_kind, decision_text

    policy = _load(policy_file)
    try:
        values = json.loads(args)
    except json.JSONDecodeError as exc:
        err.print(f"--args is not JSON: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from None
    if not isinstance(values, dict):
        err.print("--args must be a JSON object of argument names to values", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN)
    model = _tool_models(tools).get(tool)
    run = RunContext(tenant=tenant, principal=principal)
    try:
        evaluation = policy.evaluate(
            tool,
            model.model_validate(values).model_dump(mode="json") if model is not None else values,
            run,
            validate=model.model_validate if model is not None else None,
            explain=True,
            record=False,
        )
    except (PolicyEvaluationError, ValueError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from None
    table = Table(title=f"policy {policy.name} ({policy.version[:12]}) for {tool}")
    for column in ("rule", "line", "decision", "mode", "outcome", "when"):
        table.add_column(column, overflow="fold")
    for outcome in evaluation.outcomes:
        status = outcome.status
        if outcome.error:
            status += f": {outcome.error}" + (" (counted as matched)" if outcome.counted_as_match else "")
        rule = outcome.rule
        table.add_row(rule.id, str(rule.line), rule.decision, rule.mode, status, rule.when or "(always)")
    console.print(table)
    if evaluation.args != values:
        console.print(f"arguments after rewrites: {json.dumps(evaluation.args)}", markup=False)
    kind = decision_kind(evaluation.decision)
    text = decision_text(evaluation.decision)
    console.print(
        f"decision: {kind} by {evaluation.decided_by or 'the default'}" + (f": {text}" if text else ""), markup=False
    )
    if evaluation.shadow_decision is not None:
        shadow_text = decision_text(evaluation.shadow_decision)
        console.print(
            f"with the shadow rules enforced too: {decision_kind(evaluation.shadow_decision)} by "
            f"{evaluation.shadow_decided_by or 'the default'}" + (f": {shadow_text}" if shadow_text else ""),
            markup=False,
        )
    if policy.mode == "shadow":
        console.print("the policy is in shadow mode: the gate records this decision and applies none of it")
