"""The `callgate` command line: wiring only; the work lives in the packages."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.tree import Tree

app = typer.Typer(
    name="callgate",
    help="One gate between an LLM agent and every tool it can reach.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


def load_object(spec: str) -> Any:
    """Import `MODULE:ATTR` (the current directory is importable); raise `typer.BadParameter` naming
    what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"expected MODULE:ATTR, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise typer.BadParameter(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_gate(spec: str) -> Any:
    """A `Gate` from `MODULE:ATTR`: the attribute itself, or what calling it (no arguments) returns."""
    from interceptor_core import Gate

    obj = load_object(spec)
    if not isinstance(obj, Gate) and callable(obj):
        obj = obj()
    if not isinstance(obj, Gate):
        raise typer.BadParameter(f"{spec} is a {type(obj).__name__}, not a Gate or a function returning one")
    return obj


@app.command()
def describe(
    target: Annotated[str, typer.Argument(help="MODULE:ATTR of a Gate, or of a function that builds one.")],
) -> None:
    """Print each scope, its tools and the effective interceptor chain per tool. No network."""
    gate = resolve_gate(target)
    root = Tree(f"[bold]gate {gate.name}[/bold]")
    for scope in gate.describe():
        label = f"[cyan]{scope['scope']}[/cyan] {scope['path']}"
        if scope["interceptors"]:
            label += f"  interceptors: {', '.join(scope['interceptors'])}"
        if scope.get("exclude"):
            label += f"  [yellow]excludes: {', '.join(scope['exclude'])}[/yellow]"
        node = root.add(label)
        for entry in scope["tools"]:
            tool_node = node.add(
                f"[green]{entry['tool']}[/green]({', '.join(entry['inputs'])})  {entry['description']}"
            )
            chain = " -> ".join(
                f"{c['interceptor']} [dim]({c['scope']}{', mandatory' if c['mandatory'] else ''})[/dim]"
                for c in entry["chain"]
            )
            tool_node.add(f"chain: {chain or '[dim](none)[/dim]'}")
            for ex in entry["excluded"]:
                tool_node.add(f"[yellow]excluded[/yellow] {ex['interceptor']} ({ex['scope']}) by {ex['excluded_by']}")
    console.print(root)


@app.command()
def schema() -> None:
    """Print the JSON Schema of every event type (kept in docs/events.schema.json)."""
    import json

    from events import event_json_schema

    typer.echo(json.dumps(event_json_schema(), indent=2, sort_keys=True))


@app.command()
def demo() -> None:
    """Run the support-desk example through the gate and show every decision it takes."""
    from callgate.tour import run_tour

    ok = asyncio.run(run_tour(console))
    raise typer.Exit(0 if ok else 1)


@app.command()
def broker(
    host: Annotated[str, typer.Option(help="Address to listen on and advertise (keep it loopback).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 9092,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory storage) until Ctrl-C or SIGTERM."""
    import signal

    from callgate.broker import BrokerError, EmbeddedBroker

    embedded = EmbeddedBroker(host, port)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            embedded.start()
        except BrokerError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"broker ready at {embedded.bootstrap}")
        typer.echo(f"memory storage; log: {embedded.log_path}; Ctrl-C to stop")
        code = embedded.wait()
        typer.echo(f"error: the broker exited unexpectedly (code {code})\n{embedded.log_tail()}", err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        for sig in previous:  # a second Ctrl-C must not interrupt the clean stop
            signal.signal(sig, signal.SIG_IGN)
        embedded.stop()
        typer.echo("broker stopped")
    finally:
        embedded.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _host_port(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {spec!r}")
    return host, int(port)


@app.command()
def materialize(
    bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers, HOST:PORT.")],
    db: Annotated[Path, typer.Option(help="The DuckDB audit store (created if missing).")],
    topic: Annotated[str, typer.Option(help="The events topic.")] = "callgate.events",
    group: Annotated[str, typer.Option(help="The consumer group.")] = "callgate-materializer",
    api: Annotated[str | None, typer.Option(help="Serve the read API on HOST:PORT (loopback).")] = None,
    drain: Annotated[bool, typer.Option(help="Read to the end offsets as of the start, commit and exit.")] = False,
    gap_grace: Annotated[
        float, typer.Option(help="Seconds a chain gap may stay open before it is recorded (continuous runs).")
    ] = 60.0,
) -> None:
    """Consume decision events into the DuckDB audit store (until Ctrl-C / SIGTERM, or --drain)."""
    import signal

    from consumers.materializer import Materializer
    from consumers.store import StoreLockedError

    try:
        materializer = Materializer(
            bootstrap, topic, str(db), group=group, api=_host_port(api) if api else None, gap_grace_s=gap_grace
        )
    except StoreLockedError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, materializer.stop)
        return await materializer.run(drain=drain)

    try:
        if api:
            materializer.start_api()
            typer.echo(f"read API at {materializer.api.url}")
        summary = asyncio.run(run())
    except Exception as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        materializer.close()
    typer.echo(
        f"materialized {summary.records} records: {summary.stored} stored, {summary.duplicates} duplicates, "
        f"{summary.dead_letters} dead letters, {summary.chain_breaks} chain breaks, "
        f"{summary.gaps_recorded} gaps recorded, in {summary.ingest_seconds:.2f} s -> {db}"
    )


def main() -> None:
    """Entry point of the `callgate` console script."""
    app()


if __name__ == "__main__":
    main()
