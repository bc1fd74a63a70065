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
  browser's own zone, as the browser reports it, else UTC.
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
    "ENV_DB",
    "ENV_REFRESH",
    "ENV_REQUIRE_SIGNED",
    "ENV_TIMEZONE",
    "ENV_TRACE_URL",
    "ENV_TRUSTED_KEYS",
    "ConfigurationError",
    "DashboardConfig",
    "valid_zone",
]

ENV_API: Final = "CALLGATE_API"
ENV_DB: Final = "CALLGATE_DB"
ENV_REFRESH: Final = "CALLGATE_DASHBOARD_REFRESH_S"
ENV_TRACE_URL: Final = "CALLGATE_TRACE_URL"
ENV_TRUSTED_KEYS: Final = "CALLGATE_TRUSTED_KEYS"
ENV_REQUIRE_SIGNED: Final = "CALLGATE_REQUIRE_SIGNED"
ENV_TIMEZONE: Final = "CALLGATE_TIMEZONE"

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
    refresh_s: float = DEFAULT_REFRESH_S
    trace_url: str = DEFAULT_TRACE_URL
    trusted_keys: str | None = None
    """The path `events.signing.load_trusted_keys` reads (None: signatures are not checked)."""
    require_signed: bool = False
    timezone: str | None = None
    """The IANA zone times are shown in (None: each browser's own, else UTC)."""

    def __post_init__(self) -> None:
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
            refresh_s=refresh,
            trace_url=env.get(ENV_TRACE_URL) or DEFAULT_TRACE_URL,
            trusted_keys=env.get(ENV_TRUSTED_KEYS) or None,
            require_signed=_FLAGS[raw_signed],
            timezone=env.get(ENV_TIMEZONE) or None,
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
