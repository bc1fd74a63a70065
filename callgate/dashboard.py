"""The wiring of `callgate dashboard`: Streamlit serving the console (`dashboard/serve.py`, which serves
`dashboard/app.py`), headless, on loopback.

The app reads its source from the environment (`CALLGATE_API` / `CALLGATE_DB`), so this module
only checks the options, sets the variables, starts `streamlit run` as a child process, waits until
it answers, prints the URL and stays until Ctrl-C / SIGTERM (the child is stopped with it).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import dashboard
from callgate.processes import wait_until_serving
from consumers.lake import Lake
from dashboard.config import (
    ENV_API,
    ENV_AUTH,
    ENV_DATA,
    ENV_DB,
    ENV_LAKE,
    ENV_LOGIN,
    ENV_OIDC_ROLES,
    ENV_REFRESH,
    ENV_REQUIRE_SIGNED,
    ENV_TIMEZONE,
    ENV_TOKEN,
    ENV_TRACE_URL,
    ENV_TRUSTED_KEYS,
    ConfigurationError,
    DashboardConfig,
)

__all__ = ["APP", "DashboardError", "is_loopback", "run_dashboard", "streamlit_command"]

APP: Final = Path(dashboard.__file__).resolve().parent / "serve.py"
"""The Streamlit script the command serves: `dashboard/app.py` as an `st.App` (`dashboard.serve`)."""

READY_TIMEOUT_S: Final = 60.0


class DashboardError(Exception):
    """The dashboard cannot start: bad options (the message names them) or Streamlit did not come up."""


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def streamlit_command(host: str, port: int) -> list[str]:
    """`streamlit run dashboard/serve.py` headless on host:port, usage statistics off, no file watcher."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--global.developmentMode=false",
        # Tracebacks name files and values; users see the app's own messages instead.
        "--client.showErrorDetails=none",
        "--client.toolbarMode=viewer",
    ]


def run_dashboard(
    *,
    api: str | None,
    db: Path | Lake | None,
    host: str = "127.0.0.1",
    port: int = 8501,
    allow_remote: bool = False,
    refresh_s: float | None = None,
    trace_url: str | None = None,
    trusted_keys: Path | None = None,
    require_signed: bool = False,
    timezone: str | None = None,
    token: str | None = None,
    auth: Path | None = None,
    login: str | None = None,
    oidc_roles_claim: str | None = None,
    echo: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
) -> int:
    """Serve the dashboard until interrupted; returns Streamlit's exit code (0 after Ctrl-C / SIGTERM).

    `trusted_keys` (a file of verifier keys or a directory of `*.pub` files) lets the Call detail
    page's proofs check the checkpoint's signature; `require_signed` lists the Coverage page's
    `signed` check always; `timezone` (an IANA name) is the zone times are shown in (default: each
    browser's own, else UTC). `token` is the read API token the whole dashboard reads with; `auth`
    (with `db`, a token file) makes every browser session log in with one of its tokens, scoped by
    its roles; `login` is "token" (typed per browser session; through `api` forwarded to the API) or
    "oidc" (Streamlit's `st.login`, roles from `oidc_roles_claim` with `db`).

    Raises `DashboardError` for bad options (both or neither of api and db, a non-loopback host
    without `allow_remote`, trusted keys that cannot be read or hold no key) and when Streamlit
    exits or does not answer within a minute.
    """
    if isinstance(db, Lake):
        # A lake is read directly, while materializers write it.
        env = {ENV_API: api or "", ENV_DB: "", ENV_LAKE: db.catalog, ENV_DATA: db.data}
    else:
        db = db.resolve() if db is not None else None
        env = {ENV_API: api or "", ENV_DB: str(db) if db is not None else ""}
    if refresh_s is not None:
        env[ENV_REFRESH] = str(refresh_s)
    if trace_url is not None:
        env[ENV_TRACE_URL] = trace_url
    if trusted_keys is not None:
        trusted_keys = trusted_keys.resolve()
        # Checked here, before Streamlit starts: the page would only say so once someone asks for a proof.
        from events.signing import SigningError, load_trusted_keys

        try:
            load_trusted_keys(trusted_keys)
        except SigningError as exc:
            raise DashboardError(f"--trusted-keys: {exc}") from None
        env[ENV_TRUSTED_KEYS] = str(trusted_keys)
    env[ENV_REQUIRE_SIGNED] = "1" if require_signed else ""
    env[ENV_TIMEZONE] = timezone or ""
    env[ENV_TOKEN] = token or ""
    env[ENV_LOGIN] = login or ""
    env[ENV_OIDC_ROLES] = oidc_roles_claim or ""
    env[ENV_AUTH] = ""
    if auth is not None:
        auth = auth.resolve()
        # Checked here, before Streamlit starts: a login page that refuses every token helps nobody.
        from consumers.auth import ConfigError, TokenFile

        try:
            TokenFile(auth)
        except ConfigError as exc:
            raise DashboardError(f"--auth: {exc}") from None
        env[ENV_AUTH] = str(auth)
    options = {ENV_TIMEZONE: "--timezone", ENV_TOKEN: "--token", ENV_AUTH: "--auth", ENV_LOGIN: "--login"}
    try:
        DashboardConfig.from_env(env)
    except ConfigurationError as exc:
        if exc.variable in options:
            raise DashboardError(f"{options[exc.variable]}: {exc}") from None
        raise DashboardError(f"{exc} (give --api URL or --db FILE)") from None
    if not is_loopback(host):
        guarded = env[ENV_AUTH] or env[ENV_LOGIN] not in ("", "none")
        # With a login of its own, what is left is the plain HTTP it serves (tokens in clear text).
        why = (
            "the dashboard serves plain HTTP, so logins would cross the network in clear text"
            if guarded
            else "the dashboard has no login of its own (--auth, --login)"
        )
        if not allow_remote:
            raise DashboardError(
                f"--host {host} is not a loopback address: {why}. Add --allow-remote to bind it anyway, behind "
                "a TLS-terminating or authenticating proxy (docs/dashboard.md)."
            )
        warn(
            f"warning: serving the audit dashboard on {host}, reachable from other machines: {why}; put it behind "
            "a TLS-terminating or authenticating proxy (docs/dashboard.md)."
        )
    child_env = {**os.environ, **env}
    url = f"http://{'localhost' if host in ('0.0.0.0', '::') else host}:{port}"  # noqa: S104 (shown, not bound)
    proc = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
        # Streamlit's own log lines (stderr) go to the terminal; its banner (stdout) is replaced by ours.
        streamlit_command(host, port),
        env=child_env,
        stdout=subprocess.DEVNULL,
    )
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, stop)
    try:
        _wait_ready(proc, url)
        echo(f"dashboard at {url} (reading {api or db})")
        proc.wait()
        raise DashboardError(f"streamlit exited with code {proc.returncode} (its log is above)")
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    try:
        wait_until_serving(f"{url}/_stcore/health", proc, READY_TIMEOUT_S, require_ok=True)
    except ChildProcessError:
        code = proc.returncode
        raise DashboardError(f"streamlit exited with code {code} before serving (its log is above)") from None
    except TimeoutError:
        raise DashboardError(f"streamlit did not answer at {url} within {READY_TIMEOUT_S:.0f} s") from None
