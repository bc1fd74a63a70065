"""What the dashboard reads and how: taken from the environment, checked once, when built.

`callgate dashboard` sets these variables for the Streamlit process; plain `streamlit run
dashboard/app.py` reads the same ones:

- `CALLGATE_API`: the materializer's read API (`http://127.0.0.1:8765`), or
- `CALLGATE_DB`: an audit store file nobody writes (the dashboard holds it read-only while it runs);
- `CALLGATE_DASHBOARD_REFRESH_S`: seconds between refreshes of the live parts (default 5);
- `CALLGATE_TRACE_URL`: the trace viewer's link template, with `{trace_id}` (default: Jaeger on
  localhost);
- `CALLGATE_TRUSTED_KEYS`: a file of verifier keys or a directory of `*.pub` files
  (`events.signing.load_trusted_keys`): the Call detail page's proofs then check the checkpoint's
  signature too (without it they say the signature was not checked);
- `CALLGATE_REQUIRE_SIGNED`: `1` to show the Coverage page's `signed` check always (by default it
  shows when the window holds a sign of signing: a checkpoint, a signed producer or a checkpoint
  break);
- `CALLGATE_TIMEZONE`: the IANA time zone times are shown in (`Europe/Berlin`); unset, each
  browser's own zone, as the browser reports it, else UTC;
- `CALLGATE_TOKEN`: the bearer token sent to the read API when there is no per-browser login (the
  token a whole deployment reads with);
- `CALLGATE_DASHBOARD_AUTH`: with `CALLGATE_DB`, a token file (`tokens: [{subject, sha256, roles}]`):
  each browser session logs in with a token of it, and what it reads follows the token's roles;
- `CALLGATE_DASHBOARD_LOGIN`: `token` (each browser session types a token; through the read API it
  is forwarded) or `oidc` (Streamlit's `st.login`, configured in `.streamlit/secrets.toml`);
  default: `token` with `CALLGATE_DASHBOARD_AUTH`, else no login;
- `CALLGATE_OIDC_ROLES_CLAIM`: the ID token claim that lists an OIDC user's roles (default `roles`;
  `--db` mode only: through the read API, the API reads the forwarded token's roles itself).
"""

from __future__ import annotations

import os
import re
import urllib.parse
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_REFRESH_S",
    "DEFAULT_TRACE_URL",
    "ENV_API",
    "ENV_AUTH",
    "ENV_DATA",
    "ENV_DB",
    "ENV_LAKE",
    "ENV_LOGIN",
    "ENV_OIDC_ROLES",
    "ENV_REFRESH",
    "ENV_REQUIRE_SIGNED",
    "ENV_TIMEZONE",
    "ENV_TOKEN",
    "ENV_TRACE_URL",
    "ENV_TRUSTED_KEYS",
    "LOGINS",
    "ConfigurationError",
    "DashboardConfig",
    "valid_zone",
]

ENV_API: Final = "CALLGATE_API"
ENV_DB: Final = "CALLGATE_DB"
ENV_LAKE: Final = "CALLGATE_LAKE"
"""A lake's catalog (`consumers.lake`), with `ENV_DATA`: the dashboard reads the lake directly."""
ENV_DATA: Final = "CALLGATE_DATA"
ENV_REFRESH: Final = "CALLGATE_DASHBOARD_REFRESH_S"
ENV_TRACE_URL: Final = "CALLGATE_TRACE_URL"
ENV_TRUSTED_KEYS: Final = "CALLGATE_TRUSTED_KEYS"
ENV_REQUIRE_SIGNED: Final = "CALLGATE_REQUIRE_SIGNED"
ENV_TIMEZONE: Final = "CALLGATE_TIMEZONE"
ENV_TOKEN: Final = "CALLGATE_TOKEN"  # noqa: S105 (the variable's name, not a token)
ENV_AUTH: Final = "CALLGATE_DASHBOARD_AUTH"
ENV_LOGIN: Final = "CALLGATE_DASHBOARD_LOGIN"
ENV_OIDC_ROLES: Final = "CALLGATE_OIDC_ROLES_CLAIM"
LOGINS: Final = ("none", "token", "oidc")

DEFAULT_REFRESH_S: Final = 5.0
DEFAULT_TRACE_URL: Final = "http://localhost:16686/trace/{trace_id}"

# W3C trace ids are 32 hex digits (16 for some older propagators). Anything else in an event is not
# turned into a link: event fields may be attacker-controlled.
_TRACE_ID: Final = re.compile(r"[0-9a-f]{16}|[0-9a-f]{32}")

_FLAGS: Final = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}


def valid_zone(name: str) -> bool:
    """Whether `name` is an IANA time zone this machine knows (`UTC`, `Europe/Berlin`)."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


class ConfigurationError(ValueError):
    """A dashboard setting that cannot work; `variable` names the culprit."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """Where the dashboard reads (exactly one of `api` and `db`), how often its live parts refresh,
    the trace viewer's link template, the verifier keys proofs are checked with, and whether the
    Coverage page always shows the `signed` check."""

    api: str | None = None
    db: str | None = None
    lake: str | None = None
    """A lake's catalog, with `data` (`consumers.lake`): the store read in place of a file."""
    data: str | None = None
    refresh_s: float = DEFAULT_REFRESH_S
    trace_url: str = DEFAULT_TRACE_URL
    trusted_keys: str | None = None
    """The path `events.signing.load_trusted_keys` reads (None: signatures are not checked)."""
    require_signed: bool = False
    timezone: str | None = None
    """The IANA zone times are shown in (None: each browser's own, else UTC)."""
    token: str | None = None
    """The deployment's bearer token for the read API (no per-browser login)."""
    auth: str | None = None
    """A token file the sessions log in against (`--db` mode)."""
    login: str = "none"
    """How a browser session logs in: none, token or oidc (`LOGINS`)."""
    oidc_roles_claim: str = "roles"

    def __repr__(self) -> str:
        # Never the token.
        return f"DashboardConfig(source={self.source!r}, login={self.login!r}, token={'set' if self.token else None})"

    def __post_init__(self) -> None:
        if (self.lake is None) != (self.data is None):
            raise ConfigurationError(f"{ENV_LAKE} / {ENV_DATA}", "a lake needs both its catalog and its data path")
        if self.lake is not None and self.db is None:
            # The lake stands where a file would: every check below about `db` holds for it.
            object.__setattr__(self, "db", f"{self.lake} {self.data}")
        if (self.api is None) == (self.db is None):
            raise ConfigurationError(
                f"{ENV_API} / {ENV_DB}",
                f"set exactly one: {ENV_API} (the read API's URL) or {ENV_DB} (an audit store file)",
            )
        if self.api is not None:
            parsed = urllib.parse.urlsplit(self.api)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ConfigurationError(ENV_API, f"must look like http://HOST:PORT, got {self.api!r}")
        if not 0.5 <= self.refresh_s <= 3600:
            raise ConfigurationError(ENV_REFRESH, f"must be from 0.5 to 3600 seconds, got {self.refresh_s}")
        if self.login not in LOGINS:
            raise ConfigurationError(ENV_LOGIN, f"must be one of {', '.join(LOGINS)}, got {self.login!r}")
        if self.auth is not None and self.db is None:
            raise ConfigurationError(
                ENV_AUTH,
                "a token file is for the --db mode; through the read API, the API checks tokens (--login token)",
            )
        if self.login == "token" and self.db is not None and self.auth is None:
            raise ConfigurationError(ENV_LOGIN, f"a token login from a store file needs a token file ({ENV_AUTH})")
        if self.token is not None and self.login != "none":
            raise ConfigurationError(
                ENV_TOKEN, "a deployment token and a per-browser login exclude each other: unset one of them"
            )
        if self.timezone is not None and not valid_zone(self.timezone):
            raise ConfigurationError(
                ENV_TIMEZONE, f"must be an IANA time zone such as Europe/Berlin, got {self.timezone!r}"
            )
        scheme = urllib.parse.urlsplit(self.trace_url).scheme
        if scheme not in ("http", "https") or "{trace_id}" not in self.trace_url:
            raise ConfigurationError(
                ENV_TRACE_URL, f"must be an http(s) URL containing {{trace_id}}, got {self.trace_url!r}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DashboardConfig:
        """The configuration the environment describes; `ConfigurationError` naming the variable
        that is wrong or missing."""
        env = os.environ if env is None else env
        raw_refresh = env.get(ENV_REFRESH, "").strip()
        try:
            refresh = float(raw_refresh) if raw_refresh else DEFAULT_REFRESH_S
        except ValueError:
            raise ConfigurationError(ENV_REFRESH, f"must be a number of seconds, got {raw_refresh!r}") from None
        raw_signed = env.get(ENV_REQUIRE_SIGNED, "").strip().lower()
        if raw_signed not in _FLAGS:
            raise ConfigurationError(ENV_REQUIRE_SIGNED, f"must be 1 or 0, got {raw_signed!r}")
        return cls(
            api=env.get(ENV_API) or None,
            db=env.get(ENV_DB) or None,
            lake=env.get(ENV_LAKE) or None,
            data=env.get(ENV_DATA) or None,
            refresh_s=refresh,
            trace_url=env.get(ENV_TRACE_URL) or DEFAULT_TRACE_URL,
            trusted_keys=env.get(ENV_TRUSTED_KEYS) or None,
            require_signed=_FLAGS[raw_signed],
            timezone=env.get(ENV_TIMEZONE) or None,
            token=(env.get(ENV_TOKEN) or "").strip() or None,
            auth=env.get(ENV_AUTH) or None,
            login=(env.get(ENV_LOGIN) or "").strip().lower() or ("token" if env.get(ENV_AUTH) else "none"),
            oidc_roles_claim=(env.get(ENV_OIDC_ROLES) or "").strip() or "roles",
        )

    @property
    def source(self) -> str:
        """The API's URL or the file's path, for people and as a cache key."""
        return self.api if self.api is not None else str(self.db)

    def trace_link(self, trace_id: str | None) -> str | None:
        """The trace viewer's URL for `trace_id`, or None when it is not a well-formed trace id."""
        if not trace_id or not _TRACE_ID.fullmatch(trace_id):
            return None
        return self.trace_url.replace("{trace_id}", trace_id)
