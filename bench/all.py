"""`make bench`: every benchmark under bench/, then one table of their headline figures.

    python bench/all.py [--markdown FILE] [--only NAME ...] [--quick]

Each script runs as its own process (its detailed output is shown as it runs); the figures it
reports through `bench/figures.py` are gathered into one table: value, the floor measured in the
same run, the ratio to it, and the target. `--markdown` also writes the table as Markdown (what
docs/performance.md records). `--quick` passes smaller sizes to each script, for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from figures import PREFIX
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
SCRIPTS: dict[str, list[str]] = {
    "gate_overhead": [],
    "policy": [],
    "secrets_rates": [],
    "counters": [],
    "pipeline": [],
    "materialize": [],
    "lake": [],
    "kafka_clients": [],
    "proofs": [],
    "queries": [],
    "dashboard_queries": [],
    "replay": [],
    "approvals": [],
    "integrations_langchain": [],
    "integrations_openai_agents": [],
    "integrations_pydantic_ai": [],
    "mcp_proxy": [],
}
QUICK: dict[str, list[str]] = {
    "gate_overhead": ["--calls", "300", "--rounds", "3"],
    "policy": ["--calls", "300", "--rounds", "3", "--engine-evals", "200"],
    "secrets_rates": ["--quick"],
    "counters": ["--calls", "2000", "--redis-calls", "200", "--rounds", "3"],
    "pipeline": ["--events", "2000", "--rounds", "2", "--calls", "300"],
    "materialize": ["--events", "5000", "--seconds", "2", "--rounds", "1"],
    "lake": ["--events", "3000", "--rounds", "1"],
    "kafka_clients": ["--events", "20000", "--rounds", "2"],
    "proofs": ["--events", "20000", "--ingest-events", "10000", "--rounds", "1", "--proofs", "50"],
    "queries": ["--events", "20000", "--runs", "1", "--ingest", "1000"],
    "dashboard_queries": ["--events", "20000", "--runs", "1"],
    "replay": ["--events", "20000", "--runs", "1", "--api-events", "5000"],
    "approvals": ["--decisions", "30", "--events", "20000", "--pending", "1000", "--runs", "1"],
    "integrations_langchain": ["--calls", "200", "--rounds", "3"],
    "integrations_openai_agents": ["--calls", "200", "--rounds", "3"],
    "integrations_pydantic_ai": ["--calls", "300", "--rounds", "3", "--runs", "5"],
    "mcp_proxy": ["--calls", "200", "--rounds", "2"],
}


def run_script(name: str, extra: list[str], console: Console) -> tuple[list[dict[str, Any]], int, float]:
    """Run bench/<name>.py, echoing its output; its figures, exit code and seconds."""
    console.rule(f"bench/{name}.py")
    started = time.perf_counter()
    figures: list[dict[str, Any]] = []
    with subprocess.Popen(
        [sys.executable, str(HERE / f"{name}.py"), *extra], stdout=subprocess.PIPE, text=True, cwd=HERE.parent
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(PREFIX):
                figures.append({"script": name, **json.loads(line[len(PREFIX) :])})
            else:
                print(line, end="", flush=True)
    return figures, process.returncode, time.perf_counter() - started


def table(figures: list[dict[str, Any]]) -> Table:
    out = Table(title="callgate benchmarks: headline figures", title_justify="left")
    for column in ("script", "figure", "value", "floor (same run)", "ratio", "target"):
        out.add_column(column, justify="right" if column in ("value", "floor (same run)", "ratio") else "left")
    for f in figures:
        out.add_row(
            f["script"], f["name"], f"{_num(f['value'])} {f['unit']}", _num(f["floor"]) if f["floor"] else "",
            f"{f['ratio']:.2f}" if f["ratio"] is not None else "", f["target"],
        )  # fmt: skip
    return out


def markdown(figures: list[dict[str, Any]]) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} ({_cpu()}), Python {platform.python_version()}.",
        "",
        "| script | figure | value | floor (same run) | ratio | target |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for f in figures:
        ratio = f"{f['ratio']:.2f}" if f["ratio"] is not None else ""
        floor = _num(f["floor"]) if f["floor"] else ""
        lines.append(
            f"| {f['script']} | {f['name']} | {_num(f['value'])} {f['unit']} | {floor} | {ratio} | {f['target']} |"
        )
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--only", nargs="*", choices=list(SCRIPTS), help="run only these scripts")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    options = parser.parse_args()
    console = Console(width=max(Console().width, 140))
    figures: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in options.only or SCRIPTS:
        found, code, seconds = run_script(name, QUICK[name] if options.quick else SCRIPTS[name], console)
        console.print(f"bench/{name}.py: exit {code}, {seconds:.0f} s, {len(found)} figures")
        figures.extend(found)
        if code != 0:
            failed.append(name)
    console.rule("summary")
    console.print(table(figures))
    if options.markdown:
        options.markdown.write_text(markdown(figures), encoding="utf-8")
        console.print(f"Markdown table: {options.markdown}")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/red]")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
