"""The `callgate` command line: wiring only; the work lives in the packages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from callgate.loading import load_object

app = typer.Typer(
    name="callgate",
    help="One gate between an LLM agent and every tool it can reach.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
_T = TypeVar("_T")


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
            for link in entry["chain"]:
                policy = link.get("policy")
                if policy is None:
                    continue
                policy_node = tool_node.add(
                    f"policy {link['interceptor']} [dim]{policy['source']} version {policy['version'][:12]}, "
                    f"default {policy['default']}[/dim]"
                )
                for rule in policy["rules"]:
                    when = f" when {rule['when']}" if rule["when"] else ""
                    mode = " (shadow: recorded, not applied)" if rule.get("mode") == "shadow" else ""
                    policy_node.add(escape(f"{rule['id']}: {rule['decision']}{when}{mode}"))
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
def demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds of workload, then stop (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Tool calls per second of the workload.")] = 50.0,
    no_dashboard: Annotated[bool, typer.Option("--no-dashboard", help="Do not start the dashboard.")] = False,
    port: Annotated[int, typer.Option(help="The dashboard's port on loopback.")] = 8501,
    db: Annotated[Path, typer.Option(help="The audit store the materializer writes.")] = Path("callgate-demo.duckdb"),
    seed: Annotated[int, typer.Option(help="Seed of the workload's choices (same seed, same conversations).")] = 7,
    inject_bypass: Annotated[
        bool, typer.Option(help="Use the payments client once around the gate: coverage must turn red.")
    ] = False,
    workload_only: Annotated[
        bool, typer.Option(help="Only the workload, sending to --bootstrap (the compose stack's demo service).")
    ] = False,
    bootstrap: Annotated[
        str | None, typer.Option(help="An existing Kafka, HOST:PORT (default: start the embedded broker).")
    ] = None,
    topic: Annotated[str, typer.Option(help="The events topic.")] = "callgate.events",
) -> None:
    """The whole pipeline: broker, materializer, dashboard and a multi-tenant agent workload through
    the gate; exits with the coverage check's code (0 green, 1 red, 2 could not check)."""
    from callgate.pipeline_demo import DemoError, DemoOptions, run_demo

    options = DemoOptions(
        duration_s=duration,
        rate=rate,
        dashboard=not no_dashboard,
        dashboard_port=port,
        db=db,
        seed=seed,
        inject_bypass=inject_bypass,
        workload_only=workload_only,
        bootstrap=bootstrap,
        topic=topic,
    )
    try:
        code = run_demo(options, console)
    except DemoError as exc:
        Console(stderr=True).print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def keygen(
    out: Annotated[Path, typer.Option(help="Directory for the key files (created, mode 0700, if missing).")],
    name: Annotated[str, typer.Option(help="The key name: in signed checkpoints and the file names.")] = "callgate",
    if_missing: Annotated[
        bool,
        typer.Option(
            help="Keep a key pair already written (both files there: exit 0, nothing written); for a "
            "deployment's one-shot key service."
        ),
    ] = False,
) -> None:
    """Write a new Ed25519 signing key: OUT/NAME.key (0600, secret) and OUT/NAME.pub (for verifiers).
    Never overwrites a file."""
    from callgate.keygen import kept_key, run_keygen
    from events.signing import SigningError

    try:
        if if_missing and kept_key(out, name, echo=typer.echo):
            return
        run_keygen(out, name, echo=typer.echo)
    except SigningError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def tour() -> None:
    """The support-desk example in-process, call by call, with the decision each call met."""
    from callgate.tour import run_tour

    ok = asyncio.run(run_tour(console))
    raise typer.Exit(0 if ok else 1)


@app.command()
def broker(
    host: Annotated[str, typer.Option(help="Address to listen on and advertise (keep it loopback).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 9092,
    topic: Annotated[str, typer.Option(help="The events topic, created at the start with --partitions.")] = (
        "callgate.events"
    ),
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions of the topic (default 3).")] = None,
    no_topic: Annotated[bool, typer.Option("--no-topic", help="Create no topic.")] = False,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory storage) until Ctrl-C or SIGTERM.

    The events topic is created before the broker is announced ready, with the partition count every
    sink and materializer uses, so whoever connects first finds it. The broker dies with this command,
    whatever kills it (SIGKILL included), so a restart on the same port works at once."""
    import signal

    from callgate.broker import BrokerError, EmbeddedBroker

    # This thread starts the broker and lives as long as the command: the parent-death signal
    # (sent when the forking thread ends) fires exactly when the command dies.
    embedded = EmbeddedBroker(host, port, die_with_parent=True)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            embedded.start()
        except BrokerError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if not no_topic:
            from events.kafka import DEFAULT_PARTITIONS, ensure_topic

            try:
                listed = asyncio.run(ensure_topic(embedded.bootstrap, topic, partitions or DEFAULT_PARTITIONS))
            except Exception as exc:
                typer.echo(f"error: cannot create topic {topic} on {embedded.bootstrap}: {exc}", err=True)
                raise typer.Exit(2) from None
            typer.echo(f"topic {topic}: {listed} partitions")
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


LakeOption = Annotated[
    str | None,
    typer.Option(
        help="The store as a DuckLake instead of a file: its catalog, postgres:<connection string> or "
        "sqlite:<file> (with --data)."
    ),
]
DataOption = Annotated[
    str | None,
    typer.Option(help="With --lake: where the lake's Parquet files are, a directory or s3://BUCKET/PREFIX/."),
]


def _loaded(option: str, load: Callable[[Path], _T], path: Path | None, errors: type[Exception]) -> _T | None:
    """`load(path)`, or None without a path; a file it refuses ends the start: exit 2 with one line
    naming the option."""
    if path is None:
        return None
    try:
        return load(path)
    except errors as exc:
        typer.echo(f"error: {option}: {exc}", err=True)
        raise typer.Exit(2) from None


def _store_home(
    db: Path | None, lake: str | None, data: str | None, *, exit_code: int = 2, as_of: str | None = None
) -> Any:
    """The store a command reads or writes: the --db file, the --lake/--data lake (at --as-of, a past
    snapshot), or None (neither); a bad combination or lake prints one line and exits with `exit_code`."""
    from consumers.lake import LakeError, lake_from_options

    when = None
    if as_of is not None:
        try:
            when = datetime.fromisoformat(as_of.replace("Z", "+00:00"))
        except ValueError:
            typer.echo(f"error: --as-of {as_of!r} is not an ISO 8601 time (2026-12-01T00:00:00Z)", err=True)
            raise typer.Exit(exit_code) from None
        if lake is None:
            typer.echo(
                "error: --as-of reads a lake's past snapshot: give --lake and --data "
                "(a DuckDB file keeps no snapshots)",
                err=True,
            )
            raise typer.Exit(exit_code)
    if lake is None and data is None:
        return db
    if lake is None or data is None:
        typer.echo("error: --lake CATALOG and --data PATH go together", err=True)
        raise typer.Exit(exit_code)
    if db is not None:
        typer.echo("error: give --db FILE or --lake/--data, not both", err=True)
        raise typer.Exit(exit_code)
    try:
        return lake_from_options(lake, data, as_of=when)
    except LakeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exit_code) from None


AsOfOption = Annotated[
    str | None,
    typer.Option(
        help="With --lake: read the lake as it was at this time (ISO 8601 with a zone): time travel. "
        "A DuckDB file keeps no snapshots."
    ),
]

TokenOption = Annotated[
    str | None,
    typer.Option(
        envvar="CALLGATE_TOKEN",
        show_envvar=True,
        help="With --api: the read API's bearer token (default: the CALLGATE_TOKEN environment variable).",
    ),
]

# The read API's authentication and TLS options, of `materialize`.
AuthFileOption = Annotated[
    Path | None,
    typer.Option(help="The read API's token file (callgate token new): bearer tokens, stored as SHA-256 hashes."),
]
JwksOption = Annotated[
    str | None,
    typer.Option(help="Accept OIDC bearer tokens (JWTs) signed by a key of this JWKS file or http(s) URL."),
]
JwtAudienceOption = Annotated[str | None, typer.Option(help="With --jwt-jwks: the audience tokens must name.")]
JwtIssuerOption = Annotated[str | None, typer.Option(help="With --jwt-jwks: the issuer tokens must come from.")]
JwtRolesClaimOption = Annotated[
    str, typer.Option(help="With --jwt-jwks: the claim holding the roles (a dotted path reaches nested ones).")
]
TlsCertOption = Annotated[Path | None, typer.Option(help="Serve the read API over HTTPS: the certificate (PEM).")]
TlsKeyOption = Annotated[Path | None, typer.Option(help="With --tls-cert: its private key (PEM).")]
InsecureNoAuthOption = Annotated[
    bool,
    typer.Option(help="Allow a non-loopback --api without authentication (anyone reaching it reads everything)."),
]
MetricsOpenOption = Annotated[
    bool, typer.Option(help="Serve /metrics without a token (else it needs an admin token when auth is on).")
]


def _host_port(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {spec!r}")
    return host, int(port)


def _check_api_exposure(
    api: str | None, api_address: Any, authenticator: Any, tls: Any, insecure_no_auth: bool
) -> None:
    """Refuse (exit 2) a read API off loopback without authentication unless --insecure-no-auth; warn
    when it goes without authentication or without TLS there."""
    from callgate.dashboard import is_loopback

    if api_address is not None and not is_loopback(api_address[0]):
        host = api_address[0]
        if authenticator is None and not insecure_no_auth:
            typer.echo(
                f"error: --api {api} binds {host}, which is not a loopback address: give --auth FILE or "
                "--jwt-jwks/--jwt-audience/--jwt-issuer, or --insecure-no-auth to serve it without "
                "authentication (docs/security.md)",
                err=True,
            )
            raise typer.Exit(2)
        if authenticator is None:
            typer.echo(
                f"warning: serving the read API on {host}, reachable from other machines, without "
                "authentication (--insecure-no-auth): anyone who reaches it reads every tenant's events",
                err=True,
            )
        elif tls is None:
            typer.echo(
                f"warning: serving the read API on {host} without TLS: bearer tokens cross the network in "
                "clear; give --tls-cert/--tls-key or terminate TLS in front of it",
                err=True,
            )


@app.command()
def materialize(
    bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers, HOST:PORT.")],
    db: Annotated[Path | None, typer.Option(help="The DuckDB audit store (created if missing).")] = None,
    lake: LakeOption = None,
    data: DataOption = None,
    topic: Annotated[str, typer.Option(help="The events topic.")] = "callgate.events",
    group: Annotated[str, typer.Option(help="The consumer group.")] = "callgate-materializer",
    api: Annotated[
        str | None,
        typer.Option(
            help="Serve the read API on HOST:PORT (off loopback only with --auth, --jwt-* or --insecure-no-auth)."
        ),
    ] = None,
    auth: AuthFileOption = None,
    jwt_jwks: JwksOption = None,
    jwt_audience: JwtAudienceOption = None,
    jwt_issuer: JwtIssuerOption = None,
    jwt_roles_claim: JwtRolesClaimOption = "roles",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    insecure_no_auth: InsecureNoAuthOption = False,
    allow_remote: Annotated[bool, typer.Option(hidden=True, help="Old name of --insecure-no-auth.")] = False,
    metrics_open: MetricsOpenOption = False,
    decisions_topic: Annotated[
        str,
        typer.Option(
            help="With --api: reviewers decide approval requests (POST /v1/approvals/ID, role reviewer); "
            "decisions go to the events topic and to this topic, which waiting gates read ('' for none)."
        ),
    ] = "callgate.decisions",
    decision_key: Annotated[
        Path | None,
        typer.Option(
            help="Sign every reviewer's decision with this private key (callgate keygen); gates given its .pub "
            "honour no other decision."
        ),
    ] = None,
    decision_pub: Annotated[
        Path | None,
        typer.Option(
            help="The desk's public keys (a .pub file or a directory of them; default: --decision-key's): "
            "a decision none of them signed is stored as evidence but decides nothing, unless the gate "
            "that asked wrote it."
        ),
    ] = None,
    webhooks: Annotated[
        Path | None,
        typer.Option(
            help="Tell reviewers of new and expired approval requests: a YAML file of webhooks: "
            "[{url, secret_env, tenant}] (docs/interceptors.md)."
        ),
    ] = None,
    console_url: Annotated[
        str | None, typer.Option(help="The console's address, linked from the webhooks' messages.")
    ] = None,
    drain: Annotated[bool, typer.Option(help="Read to the end offsets as of the start, commit and exit.")] = False,
    gap_grace: Annotated[
        float, typer.Option(help="Seconds a chain gap may stay open before it is recorded (continuous runs).")
    ] = 60.0,
    partitions: Annotated[
        int | None,
        typer.Option(
            min=1, help="Partition count to create the topic with when it is missing at the start (default 3)."
        ),
    ] = None,
    assignment: Annotated[
        str,
        typer.Option(
            help="all: read every partition the broker lists (one materializer; restarts read again at once); "
            "group: read what the consumer group assigns (several materializers writing one lake: --lake/--data)."
        ),
    ] = "all",
    instance_id: Annotated[
        str | None,
        typer.Option(help="Static group member id with --assignment group (none by default: a dynamic member)."),
    ] = None,
    unread_grace: Annotated[
        float,
        typer.Option(
            help="Seconds a partition nobody reads, a missing topic or an unreachable broker may last before "
            "/healthz says unavailable."
        ),
    ] = 10.0,
    trusted_keys: Annotated[
        Path | None,
        typer.Option(
            help="Verify every checkpoint with these public keys: a .pub file of verifier-key lines, or a "
            "directory of *.pub files (callgate keygen)."
        ),
    ] = None,
    require_signed: Annotated[
        bool,
        typer.Option(
            help="With --trusted-keys: also record producers without a valid checkpoint (unsigned), events no "
            "checkpoint covered in time (uncovered) and producers silent without closing (silent)."
        ),
    ] = False,
) -> None:
    """Consume decision events into the audit store, a DuckDB file or a lake (until Ctrl-C / SIGTERM, or --drain)."""
    import signal

    import duckdb

    from consumers.lake import LakeError
    from consumers.materializer import Materializer
    from consumers.store import StoreError

    if assignment not in ("all", "group"):
        typer.echo(f"error: --assignment must be 'all' or 'group', got {assignment!r}", err=True)
        raise typer.Exit(2)
    store_home = _store_home(db, lake, data)
    if store_home is None:
        typer.echo("error: give --db FILE or --lake CATALOG --data PATH", err=True)
        raise typer.Exit(2)
    if require_signed and trusted_keys is None:
        typer.echo("error: --require-signed needs --trusted-keys", err=True)
        raise typer.Exit(2)
    from events.signing import SigningError, SigningKey, load_trusted_keys

    keys = _loaded("--trusted-keys", load_trusted_keys, trusted_keys, SigningError)
    signer = _loaded("--decision-key", SigningKey.load, decision_key, SigningError)
    desk_keys = _loaded("--decision-pub", load_trusted_keys, decision_pub, SigningError)
    api_address = _host_port(api) if api else None
    if allow_remote:
        typer.echo("warning: --allow-remote is the old name of --insecure-no-auth; use that", err=True)
        insecure_no_auth = True
    # Checked before the store is opened or Kafka is reached: a refused start leaves nothing behind.
    authenticator = _api_authenticator(
        api=api,
        auth=auth,
        jwt_jwks=jwt_jwks,
        jwt_audience=jwt_audience,
        jwt_issuer=jwt_issuer,
        jwt_roles_claim=jwt_roles_claim,
        insecure_no_auth=insecure_no_auth,
        metrics_open=metrics_open,
    )
    tls = _api_tls(api, tls_cert, tls_key)
    _check_api_exposure(api, api_address, authenticator, tls, insecure_no_auth)

    from consumers.webhooks import WebhookError, load_webhooks

    hooks = _loaded("--webhooks", load_webhooks, webhooks, WebhookError)

    try:
        materializer = Materializer(
            bootstrap,
            topic,
            store_home if not isinstance(store_home, Path) else str(store_home),
            group=group,
            assignment="group" if assignment == "group" else "all",
            instance_id=instance_id,
            partitions=partitions,
            api=api_address,
            api_auth=authenticator,
            metrics_open=metrics_open,
            api_tls=tls,
            decisions_topic=decisions_topic or None,
            decision_key=signer,
            decision_keys=desk_keys,
            gap_grace_s=gap_grace,
            unread_grace_s=unread_grace,
            trusted_keys=keys,
            require_signed=require_signed,
        )
    except (StoreError, LakeError, duckdb.Error) as exc:  # StoreLockedError among them; a lake out of reach
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, materializer.stop)
        return await materializer.run(drain=drain)

    notifier = _approval_notifier(materializer, hooks, console_url) if hooks else None
    try:
        if api:
            materializer.start_api()
            typer.echo(f"read API at {materializer.api.url}")
        if notifier is not None:
            notifier.start()
        summary = asyncio.run(run())
    except Exception as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        if notifier is not None:
            notifier.stop()
        materializer.close()
    typer.echo(
        f"materialized {summary.records} records: {summary.stored} stored, {summary.duplicates} duplicates, "
        f"{summary.dead_letters} dead letters, {summary.chain_breaks} chain breaks, "
        f"{summary.gaps_recorded} gaps recorded, "
        + (f"{summary.checkpoint_breaks} checkpoint breaks recorded, " if keys else "")
        + f"in {summary.ingest_seconds:.2f} s ({summary.ingest_cpu_seconds:.2f} s of CPU) -> {db}"
    )


def _approval_notifier(materializer: Any, hooks: Any, console_url: str | None) -> Any:
    """Webhooks told of the approval requests of the materializer's store (a cursor per read)."""
    from consumers.queries import run_query
    from consumers.webhooks import ApprovalNotifier

    def rows(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        con = materializer.store.cursor()
        try:
            return run_query(con, name, params).rows
        finally:
            con.close()

    def lookup(approval_id: str) -> dict[str, Any] | None:
        found = rows("approval_request", {"approval_id": approval_id})
        return found[0] if found else None

    return ApprovalNotifier(lambda: rows("pending_approvals", {"limit": 1000}), lookup, hooks, console_url=console_url)


def _api_authenticator(
    *,
    api: str | None,
    auth: Path | None,
    jwt_jwks: str | None,
    jwt_audience: str | None,
    jwt_issuer: str | None,
    jwt_roles_claim: str,
    insecure_no_auth: bool,
    metrics_open: bool,
) -> Any:
    """The read API's `Authenticator` from `materialize`'s options (None: no authentication); exits 2
    with one line for options that do not fit together or a file that cannot be used."""
    from consumers.auth import Authenticator, AuthenticatorChain, ConfigError, JwtAuthenticator, TokenFile

    def fail(message: str) -> typer.Exit:
        typer.echo(f"error: {message}", err=True)
        return typer.Exit(2)

    jwt_given = [name for name, value in (("--jwt-jwks", jwt_jwks), ("--jwt-audience", jwt_audience),
                                          ("--jwt-issuer", jwt_issuer)) if value is not None]  # fmt: skip
    if api is None and (auth is not None or jwt_given or insecure_no_auth or metrics_open):
        raise fail("--auth, --jwt-*, --insecure-no-auth and --metrics-open configure the read API: give --api too")
    if jwt_given and len(jwt_given) < 3:
        raise fail("--jwt-jwks, --jwt-audience and --jwt-issuer go together; missing: " + ", ".join(
            name for name in ("--jwt-jwks", "--jwt-audience", "--jwt-issuer") if name not in jwt_given))  # fmt: skip
    if insecure_no_auth and (auth is not None or jwt_given):
        raise fail("--insecure-no-auth contradicts --auth / --jwt-*: give one or the other")
    authenticators: list[Authenticator] = []
    try:
        if auth is not None:
            authenticators.append(TokenFile(auth))
        if jwt_jwks is not None and jwt_audience is not None and jwt_issuer is not None:
            authenticators.append(
                JwtAuthenticator(jwt_jwks, audience=jwt_audience, issuer=jwt_issuer, roles_claim=jwt_roles_claim)
            )
    except ConfigError as exc:
        raise fail(f"{'--auth' if auth is not None and not authenticators else '--jwt-jwks'}: {exc}") from None
    if not authenticators:
        return None
    return authenticators[0] if len(authenticators) == 1 else AuthenticatorChain(*authenticators)


def _api_tls(api: str | None, cert: Path | None, key: Path | None) -> tuple[str, str] | None:
    """(certificate, key) for the read API's HTTPS, checked to load; exits 2 with one line otherwise."""
    import ssl

    if cert is None and key is None:
        return None
    if api is None or cert is None or key is None:
        typer.echo("error: --tls-cert and --tls-key go together, with --api", err=True)
        raise typer.Exit(2)
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        typer.echo(f"error: --tls-cert {cert} / --tls-key {key}: cannot load them ({exc})", err=True)
        raise typer.Exit(2) from None
    return str(cert), str(key)


@app.command()
def coverage(
    db: Annotated[Path | None, typer.Option(help="An audit store file nobody is writing (opened read-only).")] = None,
    lake: LakeOption = None,
    data: DataOption = None,
    as_of: AsOfOption = None,
    api: Annotated[str | None, typer.Option(help="A running materializer's read API, http://HOST:PORT.")] = None,
    require_exercised: Annotated[
        bool, typer.Option(help="Also fail when a registered tool was never called through the gate.")
    ] = False,
    require_signed: Annotated[
        bool,
        typer.Option(help="Also fail when a producer is not signed by a trusted key, covered and not silent."),
    ] = False,
    since: Annotated[
        str | None, typer.Option(help="Only events from this time: ISO 8601, or a duration back (30m, 24h, 7d).")
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here.")] = None,
    json_report: Annotated[Path | None, typer.Option("--json", help="Write a JSON report here.")] = None,
    token: TokenOption = None,
) -> None:
    """Prove that no tool ran unmediated: exit 0 clean, 1 on a violation, 2 when it cannot check."""
    from callgate.coverage import EXIT_CANNOT_CHECK, parse_since, run_coverage

    err = Console(stderr=True)
    try:
        start = parse_since(since) if since is not None else None
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_CHECK) from None
    code = run_coverage(
        api=api,
        db=_store_home(db, lake, data, exit_code=EXIT_CANNOT_CHECK, as_of=as_of),
        token=token,
        require_exercised=require_exercised,
        require_signed=require_signed,
        since=start,
        junit=junit,
        json_path=json_report,
        console=console,
        err=err,
    )
    raise typer.Exit(code)


@app.command()
def verify(
    db: Annotated[Path | None, typer.Option(help="An audit store file nobody is writing (opened read-only).")] = None,
    lake: LakeOption = None,
    data: DataOption = None,
    as_of: AsOfOption = None,
    api: Annotated[str | None, typer.Option(help="A running materializer's read API, http://HOST:PORT.")] = None,
    event: Annotated[str | None, typer.Option(help="The event to prove (its event_id), with --db or --api.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the proof here instead of printing it.")] = None,
    proof: Annotated[Path | None, typer.Option(help="Check this proof offline (with --key; no store).")] = None,
    key: Annotated[Path | None, typer.Option(help="The gate's verifier key file (NAME.pub), with --proof.")] = None,
    token: TokenOption = None,
) -> None:
    """Prove an event is in its producer's signed checkpoint (--db | --api, --event), or check such a proof
    offline (--proof, --key): exit 0 valid, 1 invalid or not covered, 2 cannot read."""
    from callgate.verify import EXIT_CANNOT_READ, run_build, run_check

    def err(line: str) -> None:
        typer.echo(line, err=True)

    db = _store_home(db, lake, data, exit_code=EXIT_CANNOT_READ, as_of=as_of)
    if proof is not None and key is not None and db is None and api is None and event is None and out is None:
        raise typer.Exit(run_check(proof=proof, key=key, echo=typer.echo, err=err))
    if event is not None and proof is None and key is None:
        raise typer.Exit(run_build(db=db, api=api, event_id=event, out=out, echo=typer.echo, err=err, token=token))
    err("error: give --db FILE or --api URL with --event ID [--out P], or --proof P with --key K")
    raise typer.Exit(EXIT_CANNOT_READ)


@app.command()
def replay(
    policy: Annotated[Path | None, typer.Option(help="The candidate policy file.")] = None,
    interceptor: Annotated[
        str | None, typer.Option(help="The candidate Python interceptor: MODULE:ATTR (or a factory of one).")
    ] = None,
    db: Annotated[Path | None, typer.Option(help="An audit store file nobody is writing (opened read-only).")] = None,
    lake: LakeOption = None,
    data: DataOption = None,
    as_of: AsOfOption = None,
    api: Annotated[str | None, typer.Option(help="A running materializer's read API, http://HOST:PORT.")] = None,
    since: Annotated[str, typer.Option(help="From this time: ISO 8601, a duration back (24h, 7d), or all.")] = "7d",
    until: Annotated[str | None, typer.Option(help="Before this time: ISO 8601 or a duration back.")] = None,
    gate: Annotated[str | None, typer.Option(help="Only calls through this gate.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only calls through this workflow.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only calls through this agent scope.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only calls of this tool.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only calls of this tenant.")] = None,
    max_new_blocks: Annotated[
        str, typer.Option(help="The share of checked calls that may be newly denied or blocked: 0.01 or 1%.")
    ] = "0",
    fail_on_new_allows: Annotated[
        bool, typer.Option(help="Also fail when a stopped call (or one that asked a human) would go through.")
    ] = False,
    json_report: Annotated[Path | None, typer.Option("--json", help="Write the whole report as JSON here.")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here (a test case per rule).")] = None,
    token: TokenOption = None,
) -> None:
    """Try a candidate policy on the stored calls, running no tool: exit 0 within limits, 1 past them, 2 when it
    cannot check."""
    from callgate.replay import run_replay

    home = _store_home(db, lake, data, as_of=as_of)
    code = run_replay(
        policy=policy, interceptor=interceptor, db=home, api=api, since=since, until=until, gate=gate,
        workflow=workflow, agent=agent, tool=tool, tenant=tenant, max_new_blocks=max_new_blocks,
        fail_on_new_allows=fail_on_new_allows, json_path=json_report, junit=junit, console=console,
        err=Console(stderr=True), token=token,
    )  # fmt: skip
    raise typer.Exit(code)


@app.command()
def archive(
    db: Annotated[Path, typer.Option(help="The audit store file (no materializer may hold it).")],
    before: Annotated[
        str, typer.Option(help="Move whole days before this: a duration back from now (30d) or an ISO 8601 time.")
    ],
    to: Annotated[Path, typer.Option(help="The archive directory (date=YYYY-MM-DD/ folders of Parquet files).")],
    dry_run: Annotated[bool, typer.Option(help="Say what would move; write and delete nothing.")] = False,
) -> None:
    """Move whole days of events out of the store into Parquet files (the cold tier); named queries
    read them again with include_archive=true. Exit 0 done, 2 cannot."""
    from callgate.archive import run_archive

    raise typer.Exit(
        run_archive(
            db=db, before=before, to=to, dry_run=dry_run, echo=typer.echo, err=lambda line: typer.echo(line, err=True)
        )
    )


@app.command(name="api")
def read_api(
    lake: LakeOption = None,
    data: DataOption = None,
    api: Annotated[
        str,
        typer.Option(
            help="Serve the read API on HOST:PORT (off loopback only with --auth, --jwt-* or --insecure-no-auth)."
        ),
    ] = "127.0.0.1:8765",
    auth: AuthFileOption = None,
    jwt_jwks: JwksOption = None,
    jwt_audience: JwtAudienceOption = None,
    jwt_issuer: JwtIssuerOption = None,
    jwt_roles_claim: JwtRolesClaimOption = "roles",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    insecure_no_auth: InsecureNoAuthOption = False,
    metrics_open: MetricsOpenOption = False,
) -> None:
    """Serve the read API over a lake, read directly beside the materializers (one of any number of replicas),
    until Ctrl-C / SIGTERM: the same routes, authentication, tenant scoping and access log."""
    import signal
    import threading

    import duckdb

    from consumers.access_log import StoreAccessLog
    from consumers.api import ApiServer, HealthStatus, build_app
    from consumers.lake import LakeError
    from consumers.metrics import MaterializerMetrics
    from consumers.runner import StoreQueryRunner
    from consumers.store import AuditStore, StoreError

    home = _store_home(None, lake, data)
    if home is None:
        typer.echo("error: give the lake to read: --lake CATALOG --data PATH", err=True)
        raise typer.Exit(2)
    api_address = _host_port(api)
    authenticator = _api_authenticator(
        api=api, auth=auth, jwt_jwks=jwt_jwks, jwt_audience=jwt_audience, jwt_issuer=jwt_issuer,
        jwt_roles_claim=jwt_roles_claim, insecure_no_auth=insecure_no_auth, metrics_open=metrics_open,
    )  # fmt: skip
    tls = _api_tls(api, tls_cert, tls_key)
    _check_api_exposure(api, api_address, authenticator, tls, insecure_no_auth)
    try:
        # Writable: the access log is appended to the lake (inserts only, which never conflict).
        store = AuditStore(home)
    except (StoreError, LakeError, duckdb.Error) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    def health() -> HealthStatus:
        con = store.cursor()
        try:
            con.execute("SELECT count(*) FROM kafka_offsets").fetchall()
        except duckdb.Error as exc:
            return HealthStatus(ok=False, detail=f"cannot read {home}: {exc}")
        finally:
            con.close()
        return HealthStatus(ok=True, detail=f"reading {home}")

    app_ = build_app(
        StoreQueryRunner(store), MaterializerMetrics(), health, auth=authenticator,
        access_log=StoreAccessLog(store), metrics_open=metrics_open,
    )  # fmt: skip
    cert, key = tls or (None, None)
    server = ApiServer(app_, host=api_address[0], port=api_address[1], ssl_certfile=cert, ssl_keyfile=key)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
        typer.echo(f"read API at {server.url}")
        stop.wait()
    finally:
        server.stop()
        store.close()


@app.command()
def migrate(
    source: Annotated[
        list[Path], typer.Option("--from", help="A DuckDB store file nobody is writing (repeatable: several files).")
    ],
    lake: LakeOption = None,
    data: DataOption = None,
) -> None:
    """Copy DuckDB store files into a lake (--lake/--data; created when new) in one transaction, then verify
    every chain there against the files: exit 0 verified, 1 the lake's chains differ, 2 cannot copy."""
    import duckdb

    from consumers.migrate import copy_into_lake
    from consumers.store import StoreError

    home = _store_home(None, lake, data)
    if home is None:
        typer.echo("error: give the lake to copy into: --lake CATALOG --data PATH", err=True)
        raise typer.Exit(2)
    try:
        report = copy_into_lake(source, home)
    except (OSError, StoreError, duckdb.Error) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for table, rows in report.copied.items():
        typer.echo(f"{table}: {rows} rows copied")
    for name, check in (("files", report.files), ("lake", report.lake)):
        typer.echo(
            f"{name}: {check.producers} producers, {check.events} events, {check.broken_links} broken links, "
            f"{check.tampered} tampered, {check.missing} missing seqs"
        )
    if not report.verified:
        typer.echo("error: the lake's chains differ from the files'; the lake holds the copy, compare them", err=True)
        raise typer.Exit(1)
    typer.echo(f"verified: {home} holds every event once and its chains verify as the files' do")


@app.command(
    name="mcp-proxy",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def mcp_proxy(
    ctx: typer.Context,
    gate: Annotated[
        str | None, typer.Option(help="MODULE:FACTORY building the Gate (interceptors, approval handler).")
    ] = None,
    policy: Annotated[
        list[Path] | None,
        typer.Option(help="A policy file to enforce (repeatable; reloaded when it changes). With --gate: added to it."),
    ] = None,
    events: Annotated[Path | None, typer.Option(help="Append decision events to this JSONL file.")] = None,
    kafka: Annotated[str | None, typer.Option(help="Send decision events to Kafka at HOST:PORT.")] = None,
    topic: Annotated[str, typer.Option(help="The Kafka events topic.")] = "callgate.events",
    spool_dir: Annotated[Path | None, typer.Option(help="The Kafka sink's local spool directory.")] = None,
    confirm_group: Annotated[
        str | None,
        typer.Option(help="Keep events spooled until this consumer group (the materializer's) stored them."),
    ] = None,
    http: Annotated[str | None, typer.Option(help="Serve streamable HTTP on HOST:PORT instead of stdio.")] = None,
    agent: Annotated[str, typer.Option(help="The agent scope the upstream's tools are registered in.")] = "mcp-proxy",
    tenant: Annotated[str | None, typer.Option(help="The tenant every call is made for (in every event).")] = None,
    principal: Annotated[str, typer.Option(help="Who every call is made for (in every event).")] = "mcp-client",
    tokens: Annotated[
        Path | None,
        typer.Option(help="With --http: bearer tokens, one 'TOKEN PRINCIPAL [TENANT]' a line (needed off loopback)."),
    ] = None,
    startup_timeout: Annotated[
        float, typer.Option(help="Seconds the upstream has to answer as an MCP server before the proxy gives up.")
    ] = 30.0,
    jwt_jwks: Annotated[
        str | None, typer.Option(help="With --http: accept OAuth bearer tokens (JWTs) signed by a key of this JWKS.")
    ] = None,
    jwt_issuer: Annotated[str | None, typer.Option(help="The issuer (iss) OAuth tokens must name.")] = None,
    jwt_audience: Annotated[
        str | None, typer.Option(help="The audience (aud) OAuth tokens must name (default: the proxy's URL).")
    ] = None,
    resource_url: Annotated[
        str | None,
        typer.Option(help="The proxy's public URL, for the protected-resource metadata (default: from --http)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="Serve several servers: a YAML file listing them (servers: [{name, command, env}])."),
    ] = None,
) -> None:
    """Serve an MCP server's tools through the gate: mcp-proxy --gate M:F | --policy FILE -- COMMAND ARGS..."""
    from callgate.mcp_proxy import (
        OAuthClients,
        ProxyConfigError,
        TokenTable,
        build_proxy_gate,
        build_sinks,
        load_gateway_config,
        parse_listen,
        run_gateway,
        run_proxy,
    )

    try:
        if config is not None and ctx.args:
            raise ProxyConfigError("--config lists the servers: give no command after --")
        listen_on = parse_listen(http) if http else None
        if tokens is not None and listen_on is None:
            raise ProxyConfigError("--tokens authenticates HTTP clients: give --http HOST:PORT too")
        table = TokenTable.load(tokens) if tokens is not None else None
        oauth = None
        if jwt_jwks is not None:
            if listen_on is None or not jwt_issuer:
                raise ProxyConfigError("--jwt-jwks authenticates HTTP clients: give --http HOST:PORT and --jwt-issuer")
            host, port = listen_on
            resource = resource_url or f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"
            oauth = OAuthClients(jwt_jwks, issuer=jwt_issuer, audience=jwt_audience or resource, resource=resource)
        if config is not None:
            servers = load_gateway_config(config)
            built = build_proxy_gate(gate, policy or [], build_sinks(events, kafka, topic, spool_dir, confirm_group))
            code = asyncio.run(
                run_gateway(
                    built,
                    servers,
                    agent=agent,
                    tenant=tenant,
                    principal=principal,
                    startup_timeout_s=startup_timeout,
                    http=listen_on,
                    tokens=table,
                    oauth=oauth,
                )
            )
            raise typer.Exit(code)
        built = build_proxy_gate(gate, policy or [], build_sinks(events, kafka, topic, spool_dir, confirm_group))
        code = asyncio.run(
            run_proxy(
                built,
                list(ctx.args),
                http=listen_on,
                agent=agent,
                tenant=tenant,
                principal=principal,
                tokens=table,
                startup_timeout_s=startup_timeout,
                oauth=oauth,
            )
        )
    except ProxyConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def dashboard(
    api: Annotated[str | None, typer.Option(help="A running materializer's read API, http://HOST:PORT.")] = None,
    db: Annotated[Path | None, typer.Option(help="An audit store file nobody is writing (held read-only).")] = None,
    lake: LakeOption = None,
    data: DataOption = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve on.")] = 8501,
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless --allow-remote).")] = "127.0.0.1",
    allow_remote: Annotated[
        bool, typer.Option(help="Allow a non-loopback --host (no login of its own: put a proxy in front).")
    ] = False,
    refresh: Annotated[float | None, typer.Option(help="Seconds between refreshes of the live parts.")] = None,
    trace_url: Annotated[str | None, typer.Option(help="Trace viewer link template with {trace_id}.")] = None,
    trusted_keys: Annotated[
        Path | None,
        typer.Option(help="Verifier keys (a file, or a directory of .pub files): proofs then check signatures."),
    ] = None,
    require_signed: Annotated[
        bool, typer.Option(help="Always list the Coverage page's signed check (else: when producers sign).")
    ] = False,
    timezone: Annotated[
        str | None, typer.Option(help="IANA time zone times are shown in (default: each browser's own, else UTC).")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="CALLGATE_TOKEN", help="The read API token the whole dashboard reads with (--api)."),
    ] = None,
    auth: Annotated[
        Path | None, typer.Option(help="With --db: a token file; each browser session logs in with one of its tokens.")
    ] = None,
    login: Annotated[
        str | None,
        typer.Option(help="token: each browser session types a token (forwarded to --api); oidc: st.login."),
    ] = None,
    oidc_roles_claim: Annotated[
        str | None, typer.Option(help="With --login oidc and --db: the ID token claim listing roles (default roles).")
    ] = None,
) -> None:
    """Serve the audit dashboard (Streamlit) until Ctrl-C: blocked attempts, trends, coverage, pipeline."""
    from callgate.dashboard import DashboardError, run_dashboard

    try:
        code = run_dashboard(
            api=api,
            db=_store_home(db, lake, data),
            host=host,
            port=port,
            allow_remote=allow_remote,
            refresh_s=refresh,
            trace_url=trace_url,
            trusted_keys=trusted_keys,
            require_signed=require_signed,
            timezone=timezone,
            token=token,
            auth=auth,
            login=login,
            oidc_roles_claim=oidc_roles_claim,
            echo=lambda line: typer.echo(line),
            warn=lambda line: typer.echo(line, err=True),
        )
    except DashboardError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _policy_commands() -> None:
    # Imported here, so `callgate policy` shares the app without loading policy code before it is used.
    from callgate.policy import app as policy_app

    app.add_typer(policy_app, name="policy")


def _token_commands() -> None:
    from callgate.tokens import app as tokens_app

    app.add_typer(tokens_app, name="token")


def _approval_commands() -> None:
    from callgate.approvals import app as approvals_app

    app.add_typer(approvals_app, name="approvals")


_policy_commands()
_token_commands()
_approval_commands()


def main() -> None:
    """Entry point of the `callgate` console script."""
    app()


if __name__ == "__main__":
    main()
