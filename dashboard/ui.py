"""The Streamlit side shared by every page: reading (cached), the sidebar's choices, safe rendering.

Safety rule for everything here and in the pages: text that comes from events (tool names, tenants,
reasons, args, dead letters) is attacker-controlled, so it is shown only through elements that
render plain text: `st.text`, `st.code`, `st.json`, `st.dataframe` cells, chart labels and widget
option labels. Markdown elements (`st.markdown`, `st.caption`, `st.info`, metric labels, ...) carry
only the dashboard's own fixed words and numbers. No `unsafe_allow_html`, no links built from event
text (the trace link is built only from a well-formed hex trace id).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

import pandas as pd
import streamlit as st

from consumers.auth import AuthError, Forbidden, TokenFile, scope_params
from consumers.lake import lake_from_options
from consumers.queries import AS_OF_PARAM, QUERIES, QueryError, QueryResult
from consumers.reader import AccessDeniedError, ApiReader, AuditReader, FileReader, SourceUnavailableError
from dashboard.config import DEFAULT_REFRESH_S, ENV_REFRESH, ConfigurationError, DashboardConfig, valid_zone
from dashboard.data import (
    DEFAULT_WINDOW,
    WINDOWS,
    ProofView,
    Query,
    Window,
    load_coverage,
    load_proof,
    store_is_empty,
)
from dashboard.login import Access, api_access, claims_access, deployment_access, file_access
from events.signing import SigningError, VerifyingKey, load_trusted_keys

__all__ = [
    "ACCESS_KEY",
    "AS_OF_KEY",
    "access",
    "as_of",
    "as_of_unavailable",
    "config",
    "coverage_report",
    "filters_tenant",
    "fit_widths",
    "from_url",
    "keep",
    "kept",
    "local_time",
    "login",
    "logout",
    "page_number",
    "problems",
    "proof",
    "query",
    "query_as",
    "reader",
    "ready",
    "run_every",
    "table",
    "time_chart",
    "to_url",
    "trusted_keys",
    "utc_time",
    "window",
    "window_code",
    "window_label",
    "zone",
]


def _ttl() -> float:
    try:
        return min(max(float(os.environ.get(ENV_REFRESH) or DEFAULT_REFRESH_S), 0.5), 60.0)
    except ValueError:
        return DEFAULT_REFRESH_S


# Results live as long as one refresh period: a page's live part asks again each period and gets
# fresh rows, while reruns in between (typing in a filter, switching pages) cost nothing.
TTL_S: Final = _ttl()


def config() -> DashboardConfig:
    """The configuration from the environment; shows what is wrong and stops the page if it is."""
    try:
        return DashboardConfig.from_env()
    except ConfigurationError as exc:
        st.error("The dashboard is not configured.")
        st.text(str(exc))
        st.stop()
        raise  # st.stop() raises; this line only tells type checkers so


@st.cache_resource(show_spinner=False)
def _file_reader(path: str) -> FileReader:
    # Kept open for the dashboard's life: --db is for a file nobody writes (a writer would need
    # the lock this read-only open holds; the read API is the way to watch a live store).
    return FileReader(path)


@st.cache_resource(show_spinner=False)
def _lake_reader(catalog: str, data: str) -> FileReader:
    # A lake takes no lock: the dashboard reads it while materializers write it.
    return FileReader(lake_from_options(catalog, data))


def _store_reader(cfg: DashboardConfig) -> FileReader:
    if cfg.lake is not None and cfg.data is not None:
        return _lake_reader(cfg.lake, cfg.data)
    return _file_reader(str(cfg.db))


def reader(cfg: DashboardConfig | None = None) -> AuditReader:
    """The reader of the configured source for this session (one `FileReader` per file, shared; an
    `ApiReader` is stateless and sends the session's token)."""
    cfg = cfg or config()
    if cfg.api is not None:
        return ApiReader(cfg.api, token=access().token)
    return _store_reader(cfg)


def _reader_with(token: str | None) -> AuditReader:
    cfg = config()
    if cfg.api is not None:
        return ApiReader(cfg.api, token=token)
    return _store_reader(cfg)


# `who` (the session's `Access.key`) keeps the results of sessions with different rights apart:
# through the read API, the API scopes each token's rows, which the parameters do not show.
@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=2000)
def _cached_query(
    source: str, who: str, name: str, params: tuple[tuple[str, Any], ...], _token: str | None
) -> list[dict[str, Any]]:
    return _reader_with(_token).query(name, dict(params)).rows


def query(name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of named query `name` with `params` as the session may read them, cached for one refresh
    period, as of the sidebar's As of (`as_of`). With a login the dashboard checks itself (`--db
    --auth`, OIDC from a file), the parameters go through `consumers.auth.scope_params` first (a
    tenant bound, a query the roles do not allow refused with `Forbidden`). Raises
    `SourceUnavailableError` (`AccessDeniedError` when the read API refuses) and `QueryError` as the
    reader does (errors are never cached)."""
    session = access()
    return _query_as(session, name, _chosen_tenant(session, name, params, filters_tenant()), as_of())


def query_as(session: Access) -> Query:
    """`query` for `session` (and the tenant and As of picked now), usable outside the page's run: a
    download's deferred data runs on a thread of its own, where the session state is not this
    session's."""
    chosen, when = filters_tenant(), as_of()
    return lambda name, params: _query_as(session, name, _chosen_tenant(session, name, params, chosen), when)


def _chosen_tenant(session: Access, name: str, params: Mapping[str, Any], chosen: str | None) -> Mapping[str, Any]:
    # A login for several tenants reads one at a time: a tenant query that names none reads the
    # one picked in the sidebar (scope_params would refuse it without one).
    spec = QUERIES.get(name)
    several = session.identity is not None and not session.all_tenants and len(session.identity.tenants) > 1
    if several and spec is not None and spec.scope == "tenant" and not params.get("tenant") and chosen:
        return {**params, "tenant": chosen}
    return params


def _query_as(session: Access, name: str, params: Mapping[str, Any], when: datetime | None) -> list[dict[str, Any]]:
    given: Mapping[str, Any] = params
    if session.identity is not None:
        given = scope_params(name, params, session.identity)
    if when is not None:
        # A past view: every query answers from the lake as it was (the named queries' as_of).
        given = {**given, AS_OF_PARAM: when.isoformat()}
    return _cached_query(config().source, session.key, name, tuple(sorted(given.items())), session.token)


# The coverage checks take seconds over a million events (bench/dashboard_queries.py): their
# verdict is kept a minute, and the Coverage page refreshes it no more often.
COVERAGE_TTL_S: Final = 60.0


class _ReaderAsOf:
    """A reader whose every query runs as of one past time (the sidebar's As of)."""

    def __init__(self, inner: AuditReader, when: datetime) -> None:
        self.inner = inner
        self.when = when

    @property
    def source(self) -> str:
        return self.inner.source

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        return self.inner.query(name, {**(params or {}), AS_OF_PARAM: self.when.isoformat()})

    def close(self) -> None:
        pass  # the inner reader is shared: the dashboard keeps it open


@st.cache_data(ttl=COVERAGE_TTL_S, show_spinner=False, max_entries=50)
def _cached_coverage(
    source: str, who: str, since: datetime | None, require_signed: bool, when: datetime | None, _token: str | None
) -> dict[str, Any]:
    reader = _reader_with(_token)
    return load_coverage(reader if when is None else _ReaderAsOf(reader, when), since, require_signed=require_signed)


def coverage_report(since: datetime | None) -> dict[str, Any]:
    """`dashboard.data.load_coverage` (the checks of `callgate coverage --require-exercised`, and
    `signed` when it applies), cached. `Forbidden` for a session limited to tenants (the checks read
    every tenant)."""
    cfg = config()
    session = access()
    if not session.all_tenants:
        raise Forbidden("the coverage checks read every tenant: they need the admin or auditor role")
    return _cached_coverage(cfg.source, session.key, since, cfg.require_signed, as_of(), session.token)


# -- login: who this browser session reads as ----------------------------------------------------

ACCESS_KEY: Final = "callgate_access"


@st.cache_resource(show_spinner=False)
def _token_file(path: str) -> TokenFile:
    return TokenFile(path)


@st.cache_resource(show_spinner=False, ttl=60)
def _deployment(api: str | None, digest: str, _token: str | None) -> Access:
    return deployment_access(api=api, token=_token)


def access() -> Access:
    """This session's `Access`: the one its login gave, or, without a login, the deployment's
    (probed through the read API once a minute). Stops the page when the read API refuses the
    deployment's token."""
    held = st.session_state.get(ACCESS_KEY)
    if isinstance(held, Access):
        return held
    cfg = config()
    if cfg.login != "none":
        # Not logged in: `login()` runs before any page, so only a caller outside a page gets here.
        raise AuthError("this session has not logged in")
    digest = hashlib.sha256((cfg.token or "").encode()).hexdigest()
    try:
        return _deployment(cfg.api, digest, cfg.token)
    except SourceUnavailableError:
        # The pages say that the store cannot be read; the probe is tried again on the next run.
        return Access("deployment", None, cfg.token, all_tenants=True)
    except AuthError as exc:
        if cfg.token is None:
            st.error("The read API needs a token: start the dashboard with --token, or --login token.")
        else:
            st.error("The read API refuses the dashboard's token (--token / CALLGATE_TOKEN).")
        st.text(str(exc))
        st.stop()
        raise  # st.stop() raises; this line only tells type checkers so


def login() -> Access | None:
    """The session's access, or None after drawing the login (the page then stops): a token form
    (`--auth` with `--db`, `--login token` with `--api`), or Streamlit's OIDC login (`--login
    oidc`). The token is kept in the server-side session state only, never in the URL."""
    cfg = config()
    held = st.session_state.get(ACCESS_KEY)
    if isinstance(held, Access) or cfg.login == "none":
        return access()
    if cfg.login == "oidc":
        return _oidc_login(cfg)
    st.title("callgate audit")
    st.caption("Log in with your token. It is kept for this browser session only, on the server.")
    with st.form("login_form", clear_on_submit=True):
        token = st.text_input("Token", type="password", key="login_token")
        submitted = st.form_submit_button("Log in", type="primary")
    if submitted and token.strip():
        try:
            if cfg.api is not None:
                granted = api_access(cfg.api, token)
            else:
                granted = file_access(_token_file(str(cfg.auth)), token)
        except AuthError:
            st.error("This token was refused.")
            return None
        except SourceUnavailableError as exc:
            st.error("The audit store cannot be read right now, so the token cannot be checked.")
            st.text(str(exc))
            return None
        st.session_state[ACCESS_KEY] = granted
        st.rerun()
    return None


def _oidc_login(cfg: DashboardConfig) -> Access | None:
    # Without an identity behind the run (no browser, no [auth] settings), nobody is logged in.
    if not getattr(st.user, "is_logged_in", False):
        st.title("callgate audit")
        st.caption("Log in with your organization's identity provider.")
        st.button("Log in", on_click=st.login, type="primary")
        return None
    try:
        granted = claims_access(
            st.user.to_dict(),
            roles_claim=cfg.oidc_roles_claim,
            api=cfg.api,
            id_token=st.user.tokens.get("id"),
        )
    except AuthError as exc:
        st.error("Your login gives no access to the audit store.")
        st.text(str(exc))
        st.button("Log out", on_click=st.logout)
        return None
    st.session_state[ACCESS_KEY] = granted
    return granted


def logout() -> None:
    """End this session's login (and the identity provider's session for OIDC)."""
    st.session_state.pop(ACCESS_KEY, None)
    if config().login == "oidc":
        st.logout()


# -- proofs -------------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def _trusted_keys(path: str) -> dict[str, VerifyingKey]:
    return load_trusted_keys(path)


def trusted_keys() -> dict[str, VerifyingKey] | None:
    """The configured verifier keys by key id (None when none are configured); shows what is wrong
    and stops the page when the path holds no usable key."""
    cfg = config()
    if cfg.trusted_keys is None:
        return None
    try:
        return _trusted_keys(cfg.trusted_keys)
    except SigningError as exc:
        st.error("The dashboard's trusted keys cannot be read.")
        st.text(str(exc))
        st.stop()
        raise  # st.stop() raises; this line only tells type checkers so


def proof(event_id: str) -> ProofView:
    """The inclusion proof of `event_id`, checked with the trusted keys if configured. Its rows are
    cached for one refresh period like every query's; raises as `query` does."""
    return load_proof(query, event_id, trusted_keys())


# -- the sidebar's choices ----------------------------------------------------------------------


def window() -> Window:
    """The window picked in the sidebar, its start rounded to the refresh period; in a past view
    (`as_of`), the window before that time."""
    label = st.session_state.get("window", DEFAULT_WINDOW)
    return Window.named(label if label in WINDOWS else DEFAULT_WINDOW, now=as_of(), step_s=TTL_S)


AS_OF_KEY: Final = "as_of"
"""The sidebar's As of: ISO 8601 text (UTC when it names no zone), blank for now; `?as_of=` in the URL."""


def as_of_unavailable() -> str | None:
    """Why the sidebar offers no As of (a DuckDB file keeps no snapshots), or None when it does: a
    lake, or the read API (which answers as_of when its store is a lake)."""
    cfg = config()
    if cfg.api is not None or cfg.lake is not None:
        return None
    return "A DuckDB file keeps no past snapshots: time travel needs the store in a lake (callgate migrate)."


def as_of() -> datetime | None:
    """The past time the sidebar's As of names (UTC), or None: now (blank, or no time travel here).
    `ValueError` for text that is not an ISO 8601 time (the sidebar says so and the page stops)."""
    text = str(st.session_state.get(AS_OF_KEY) or "").strip()
    if not text or as_of_unavailable() is not None:
        return None
    when = datetime.fromisoformat(text)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def filters_tenant() -> str | None:
    """The tenant the session is limited to, else the one typed in the sidebar, or None."""
    held = st.session_state.get(ACCESS_KEY)
    if isinstance(held, Access) and held.tenant is not None:
        return held.tenant
    tenant = str(st.session_state.get("tenant") or "").strip()
    return tenant or None


def run_every() -> float | None:
    """How often live parts rerun: the refresh period, or never when Live is switched off."""
    return config().refresh_s if st.session_state.get("live", True) else None


# -- the URL: what a shared link restores ---------------------------------------------------------


def from_url(key: str, param: str | None = None, *, parse: Callable[[str], Any] = str) -> None:
    """Seed widget `key` from the URL's query parameter `param` (default: the key), once: only while
    the widget has no state of its own in this session, so a link opened restores what its sender
    saw and what the user changes afterwards wins. A value `parse` refuses (`ValueError`) is ignored."""
    name = param or key
    if key in st.session_state or name not in st.query_params:
        return
    with contextlib.suppress(ValueError):
        st.session_state[key] = parse(st.query_params[name])


def to_url(param: str, value: Any, default: Any = None) -> None:
    """Keep `value` in the URL as `param` (left out when it is the default or blank), so the
    address bar is always a link to what the page shows."""
    text = "" if value is None else str(value).strip()
    if value == default or not text:
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get(param) != text:
        st.query_params[param] = text


def keep(*keys: str) -> None:
    """Keep page widgets' values for the session: a value kept the last time the page ran comes
    back when the user returns from another page (Streamlit forgets the state of a widget a page
    did not draw). Call before the widgets are drawn, after `from_url` (a link wins)."""
    for key in keys:
        kept = f"kept:{key}"
        if key not in st.session_state and kept in st.session_state:
            st.session_state[key] = st.session_state[kept]


def kept(*keys: str) -> None:
    """Note the widgets' values as they are now, for `keep` to bring back."""
    for key in keys:
        if key in st.session_state:
            st.session_state[f"kept:{key}"] = st.session_state[key]


def page_number(text: str) -> int:
    """A page number from the URL (1 or more); `ValueError` for anything else."""
    number = int(text)
    if number < 1:
        raise ValueError(f"not a page number: {text!r}")
    return number


def window_code(label: str) -> str:
    """The URL form of a window (`15m`, `1h`, `24h`, `7d`, `all`)."""
    return Window.named(label).duration() or "all"


def window_label(code: str) -> str:
    """The window a URL's `window` names; `ValueError` for one that is not offered."""
    for label in WINDOWS:
        if window_code(label) == code:
            return label
    raise ValueError(f"unknown window {code!r}")


# -- states and errors --------------------------------------------------------------------------


@contextlib.contextmanager
def problems() -> Iterator[None]:
    """Show an unreachable store or a rejected parameter as a message instead of a traceback."""
    try:
        yield
    except Forbidden as exc:
        st.warning("Your login's roles do not allow this.")
        st.text(str(exc))
    except AccessDeniedError as exc:
        if exc.status == 403:
            st.warning("Your login's roles do not allow this.")
        else:
            st.error("The read API refused the token: log in again.")
        st.text(str(exc))
    except SourceUnavailableError as exc:
        st.error("The audit store cannot be read right now. This page retries on its own while Live is on.")
        st.text(str(exc))
    except QueryError as exc:
        st.error("A filter was not accepted.")
        st.text(str(exc))


def ready(*, allow_empty: bool = False) -> bool:
    """Whether the page has data to show; if not, says why (store unreachable, store empty)."""
    try:
        empty = store_is_empty(query, scoped=not access().all_tenants)
    except SourceUnavailableError as exc:
        st.error("The audit store cannot be read right now. This page retries on its own while Live is on.")
        st.text(str(exc))
        return False
    if empty and not allow_empty:
        st.info(
            "The audit store holds no events yet. Decisions appear here as soon as the materializer "
            "stores them; this page refreshes on its own while Live is on."
        )
        return False
    return True


# -- times --------------------------------------------------------------------------------------

TIME_COLUMNS: Final = frozenset(
    {
        "time",
        "bucket",
        "started_at",
        "last_time",
        "first_time",
        "first_seen",
        "last_seen",
        "checkpoint_time",
        "received_at",
        "first_received",
        "last_received",
        "last_event_time",
        "last_ingested_at",
        "offset_updated_at",
        "recorded_at",
        "kafka_time",
    }
)
"""Table columns that hold times (ISO 8601 text, UTC): shown in the dashboard's zone."""

TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


def zone() -> tuple[ZoneInfo, str]:
    """The zone times are shown in and its name: `--timezone` (CALLGATE_TIMEZONE) if set, else the
    browser's own zone as it reports it (`st.context.timezone`), else UTC."""
    name = config().timezone or _browser_zone() or "UTC"
    return ZoneInfo(name), name


def _browser_zone() -> str | None:
    try:
        name = st.context.timezone
    except Exception:  # no browser behind this run (a bare script)
        return None
    return name if isinstance(name, str) and valid_zone(name) else None


def local_time(value: Any, tz: ZoneInfo | None = None) -> Any:
    """An ISO 8601 time as `YYYY-MM-DD HH:MM:SS` in the dashboard's zone (other values as they are)."""
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(tz or zone()[0]).strftime(TIME_FORMAT)


def utc_time(value: str) -> str:
    """An ISO 8601 time as `YYYY-MM-DD HH:MM:SS UTC`."""
    moment = datetime.fromisoformat(value)
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime(TIME_FORMAT) + " UTC"


def time_chart(
    rows: Sequence[Mapping[str, Any]],
    *,
    value: str,
    color: str,
    seconds: int,
    title: str,
    rate: bool = False,
    span: tuple[datetime, datetime] | None = None,
) -> None:
    """Draw `value` per time bucket (`bucket` rows, `seconds` wide) by `color`: stacked bars as wide
    as their buckets, or, with `rate`, a point per bucket joined by lines (one bucket still shows).
    The axis is in the dashboard's zone (named in its title); each tooltip gives the bucket's start
    there and in UTC. With `span` (UTC instants), the axis runs exactly from its start to its end
    (say, to now and not past it)."""
    import altair as alt

    tz, name = zone()
    data = []
    for row in rows:
        start = datetime.fromisoformat(str(row["bucket"]))
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        end = start + timedelta(seconds=seconds)
        # Wall-clock times of the zone, written as UTC and drawn on a UTC scale: the browser then
        # shows them as they are, whatever its own zone.
        data.append(
            {
                value: row[value],
                color: str(row[color]),
                "start": start.astimezone(tz).replace(tzinfo=None).isoformat() + "Z",
                "end": end.astimezone(tz).replace(tzinfo=None).isoformat() + "Z",
                "middle": (start + (end - start) / 2).astimezone(tz).replace(tzinfo=None).isoformat() + "Z",
                f"from ({name})": start.astimezone(tz).strftime(TIME_FORMAT),
                "from (UTC)": start.astimezone(UTC).strftime(TIME_FORMAT),
            }
        )
    frame = pd.DataFrame(data)
    axis_title = f"time ({name})"
    # Labels as fine as the buckets; a few buckets get room around them instead of the whole width.
    label = "%H:%M:%S" if seconds < 60 else "%m-%d %H:%M" if seconds < 86400 else "%Y-%m-%d"
    starts = sorted({str(row["start"]) for row in data})
    domain: Any = alt.Undefined
    if starts and len(starts) < 8:
        pad = timedelta(seconds=seconds * 2)
        first = datetime.fromisoformat(starts[0].rstrip("Z")) - pad
        last = datetime.fromisoformat(starts[-1].rstrip("Z")) + timedelta(seconds=seconds) + pad
        domain = [first.isoformat() + "Z", last.isoformat() + "Z"]
    if span is not None:
        domain = [edge.astimezone(tz).replace(tzinfo=None).isoformat() + "Z" for edge in span]
    scale = alt.Scale(type="utc", domain=domain)
    axis = alt.Axis(format=label, labelAngle=0)
    tooltip = [f"from ({name}):N", "from (UTC):N", f"{color}:N", f"{value}:Q"]
    base = alt.Chart(frame)
    chart: Any
    if rate:
        encode: dict[str, Any] = {
            "x": alt.X("middle:T", title=axis_title, scale=scale, axis=axis),
            "y": alt.Y(f"{value}:Q", title=title),
            "color": alt.Color(f"{color}:N", title=color),
            "tooltip": tooltip,
        }
        chart = alt.layer(base.mark_line(), base.mark_point(filled=True, size=60)).encode(**encode)
    else:
        chart = base.mark_bar().encode(
            x=alt.X("start:T", title=axis_title, scale=scale, axis=axis),
            x2="end:T",
            y=alt.Y(f"sum({value}):Q", title=title, stack=True),
            color=alt.Color(f"{color}:N", title=color),
            tooltip=tooltip,
        )
    st.altair_chart(chart, width="stretch")


# -- rendering ----------------------------------------------------------------------------------


PAGE_WIDTH_PX: Final = 978
"""The width a table has across a page at 1440x900 with the sidebar open: the widths `table` gives
its columns add up to no more, so the last column is on screen (wider screens stretch them)."""

HALF_WIDTH_PX: Final = 480
"""A table's width in one of two columns of a page at 1440x900."""

HEADERS: Final[dict[str, str]] = {
    "approvals_asked": "approvals",
    "call_id": "call id",
    "checkpoint_seq": "checkpoint",
    "checkpoint_time": "checkpoint time",
    "decided_by": "interceptor",
    "event_id": "event id",
    "first_received": "first received",
    "first_seen": "first seen",
    "first_time": "first event",
    "last_event_time": "last event",
    "last_ingested_at": "last ingested",
    "last_message": "last message",
    "last_received": "last received",
    "last_seen": "last seen",
    "last_time": "last event",
    "lag_messages": "lag (messages)",
    "max_delay_s": "max delay (s)",
    "median_delay_s": "median delay (s)",
    "next_offset": "next offset",
    "offset_updated_at": "offset updated",
    "p95_delay_s": "p95 delay (s)",
    "parent_call_id": "parent call",
    "producer_id": "producer",
    "received_at": "received",
    "recent_events": "events (15 min)",
    "run_id": "run id",
    "sample_error": "sample error",
    "sample_message": "sample message",
    "sample_position": "sample position",
    "sample_preview": "sample preview",
    "sample_tool": "sample tool",
    "seconds_since_commit": "since commit (s)",
    "shadow_decided_by": "shadow interceptor",
    "shadow_outcome": "shadow outcome",
    "shadow_rule": "shadow rule",
    "signed_tree_size": "signed tree size",
    "started_at": "started",
    "thread_id": "thread",
    "trace_id": "trace id",
    "turn_decision": "turn decision",
    "value_bytes": "bytes",
}
"""Table headers in words for the column names of the queries (the CSV exports keep the names)."""

_CHAR_PX: Final = 7.0
_PAD_PX: Final = 18
_MIN_COLUMN_PX: Final = 60
_SELECT_PX: Final = 34


def fit_widths(texts: Mapping[str, Sequence[str]], budget: int, whole: Collection[str] = ()) -> dict[str, int]:
    """Pixel widths for columns whose header and cells are `texts` (header first), adding up to at
    most `budget` where they can: each column as wide as its longest text when they all fit, else the
    widest columns not in `whole` cut to one common width (never below a minimum) so that they do.
    Text a column cuts is whole in the cell's tooltip."""
    natural = {
        name: max(_MIN_COLUMN_PX, round(max(map(len, cells), default=0) * _CHAR_PX) + _PAD_PX)
        for name, cells in texts.items()
    }
    if sum(natural.values()) <= budget:
        return natural
    # The widest columns share what the others leave: the largest common cap that fits.
    left = budget - sum(width for name, width in natural.items() if name in whole)
    cuttable = sorted(width for name, width in natural.items() if name not in whole)
    cap = _MIN_COLUMN_PX
    for index, width in enumerate(cuttable):
        share = left // (len(cuttable) - index)
        if width > share:
            cap = max(_MIN_COLUMN_PX, share)
            break
        left -= width
    return {name: width if name in whole else min(width, cap) for name, width in natural.items()}


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return value


def frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows as a DataFrame of plain cells (nested values as JSON text), in `columns` order if given;
    a text column's missing values are blank, never the word "None"."""
    names = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    data = pd.DataFrame([[_cell(row.get(name)) for name in names] for row in rows], columns=names)
    for name in names:
        present = data[name].dropna()
        if len(present) < len(data) and all(isinstance(value, str) for value in present):
            data[name] = data[name].astype(object).where(data[name].notna(), "")
    return data


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    key: str | None = None,
    selectable: bool = False,
    empty: str = "Nothing to show.",
    on_select: Callable[[], None] | None = None,
    width_px: int = PAGE_WIDTH_PX,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """Rows as a read-only table (cells are text, never markup) whose headers are words (`headers`,
    else `HEADERS`) and whose columns fit in `width_px` (`fit_widths`); with `selectable`, one row can be picked and
    the selection event is returned (`on_select`, if given, is called when the user changes the
    selection, before the page runs again)."""
    if not rows:
        st.caption(empty)
        return None
    data = frame(rows, columns)
    tz, name = zone()
    shown: dict[str, str] = {}
    for column in data.columns:
        shown[column] = (headers or {}).get(column) or HEADERS.get(column, column.replace("_", " "))
        if column in TIME_COLUMNS:
            data[column] = [local_time(v, tz) for v in data[column]]
            shown[column] = f"{shown[column]} ({name})"
    texts = {column: [shown[column], *("" if pd.isna(v) else str(v) for v in data[column])] for column in data.columns}
    # Times are short and read whole; long text and ids give way.
    widths = fit_widths(texts, width_px - (_SELECT_PX if selectable else 0), TIME_COLUMNS)
    labels: dict[str, Any] = {}
    for column in data.columns:
        help_text = (
            f"Local time in {name}; the store keeps UTC (see the Call detail page)." if column in TIME_COLUMNS else None
        )
        labels[column] = st.column_config.Column(shown[column], width=widths[column], help=help_text)
    if selectable:
        return st.dataframe(
            data,
            hide_index=True,
            key=key,
            on_select=on_select or "rerun",
            selection_mode="single-row",
            width="stretch",
            column_config=labels,
        )
    return st.dataframe(data, hide_index=True, key=key, width="stretch", column_config=labels)
