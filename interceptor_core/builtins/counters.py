"""Call counters: how many calls of some tools reached the gate in the last window, by one key.

A counter answers `count_calls(tool_glob, key, window)` of policy files and backs `RateLimit`:
calls of the tools matching `tool_glob` whose timestamps fall in `(at - window_s, at]`, made for
the same tenant, principal or run as the asking call, or by everyone ("global"). This is how
rate limits and quotas are written.

- `InProcessCounter`: one process's calls, in memory. The default.
- `RedisCounter`: calls of every gate process sharing one Redis, for limits that hold across
  processes and hosts.

Both keep `retention_s` of history (default 24 h) and refuse a longer window: a window longer than
what is kept could only be answered by undercounting, which for a quota is failing open.
"""

from __future__ import annotations

import bisect
import fnmatch
import math
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from threading import Lock
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeAlias, get_args

from interceptor_core.builtins._config import check_identity
from interceptor_core.context import RunContext, ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    import redis

Key: TypeAlias = Literal["tenant", "principal", "run", "global"]
KEYS: Final[tuple[Key, ...]] = get_args(Key)
"""What calls are counted by: the asking call's tenant, principal, run (`run_id`), or all calls."""

DEFAULT_RETENTION_S: Final = 24 * 3600.0


class CallCounter(Protocol):
    """Records the calls that reached a check, and counts them by tool glob, key and window.

    `record` and `count` may be called from several threads at once. Either may raise what its
    backend raises (a Redis that is down: `redis.exceptions.ConnectionError`); the interceptor or
    policy calling it lets that propagate, and the gate fails closed (denies the call).
    """

    @property
    def retention_s(self) -> float:
        """How much history is kept; `count` refuses a longer window."""
        ...

    def record(self, tool: str, run: RunContext, call_id: str, at: float) -> None:
        """One call of `tool`, made for `run`, reached the check at `at` (seconds, `time.time()` scale).

        Idempotent per call: recording the same `call_id` and `tool` again counts once, at the time
        first recorded.
        """
        ...

    def count(self, tool_glob: str, key: str, run: RunContext, window_s: float, at: float) -> int:
        """Calls recorded at times after `at - window_s` of the tools matching `tool_glob`
        (`fnmatch.fnmatchcase`), made for the same `key` value as `run`: the same tenant,
        principal or run id, or every call for "global". A call recorded with a time later than
        `at` counts too: two concurrent calls, each recorded before it counts, can then never both
        pass a limit, whatever order their clocks read them in.

        A run without a tenant (or principal) is counted with every other run without one: they
        share one bucket of their own, never exempt from a limit and never mixed with a tenant
        named "" or "None". Raises `ValueError` for a key not in `KEYS` and for a window that is
        not positive or is longer than `retention_s`.
        """
        ...


@dataclass(frozen=True, slots=True)
class Footprint:
    """What an `InProcessCounter` holds: buckets (key, key value, tool), timestamps, call ids."""

    buckets: int
    timestamps: int
    call_ids: int


def _key_value(key: str, run: RunContext) -> str | None:
    match key:
        case "tenant":
            return run.tenant
        case "principal":
            return run.principal
        case "run":
            return run.run_id
        case "global":
            return None
        case _:
            raise ValueError(f"unknown counter key {key!r}; expected one of {', '.join(KEYS)}")


@lru_cache(maxsize=1024)
def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def _check_retention(retention_s: float) -> float:
    if not isinstance(retention_s, int | float) or not 0 < retention_s < math.inf:
        raise ConfigurationError(f"retention_s must be a positive number of seconds, got {retention_s!r}")
    return float(retention_s)


def _check_window(window_s: float, retention_s: float) -> None:
    # `not w > 0` also refuses NaN.
    if not window_s > 0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    if window_s > retention_s:
        raise ValueError(
            f"window_s={window_s!r} is longer than the counter keeps (retention_s={retention_s!r}); "
            "build the counter with a retention_s at least as long as the longest window"
        )


_SHARED: dict[str, InProcessCounter] = {}
_SHARED_LOCK = Lock()


def shared_counter(name: str) -> InProcessCounter:
    """The process's one `InProcessCounter` for the policy called `name` (made on first use).

    Every policy of that name loaded in this process counts into it, however many times its file
    is loaded and by however many gates: a limit of 5 is 5 for the process. Safe from several
    threads. A `RedisCounter` extends the same sharing across processes.
    """
    with _SHARED_LOCK:
        counter = _SHARED.get(name)
        if counter is None:
            counter = _SHARED[name] = InProcessCounter()
        return counter


class InProcessCounter:
    """A `CallCounter` in this process's memory: exact, and O(log n) per count of one tool.

    Safe from several threads (one lock; each call holds it for a few dict and list operations,
    never for I/O). Never raises on `record`; `count` raises `ValueError` for a bad key or window.

    Memory is bounded by `retention_s` (default 24 h): every `retention_s / 8` of `clock` time, a
    sweep drops timestamps and call ids older than `clock() - retention_s`, and drops the buckets
    left empty (so a long-running process with many runs does not grow with their number). Expect
    about 100 bytes per call within the retention, times four (each call is filed under its tenant,
    principal, run and "global"); set `retention_s` to the longest window your limits use.

    `at` is expected near `clock()`: the sweep measures age by the clock, not by `at`.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self._clock = clock
        self._retention_s = _check_retention(retention_s)
        self._sweep_every_s = self._retention_s / 8
        self._next_sweep = clock() + self._sweep_every_s
        self._lock = Lock()
        # (key, key value) -> tool -> timestamps, ascending.
        self._buckets: dict[tuple[str, str | None], dict[str, list[float]]] = {}
        # (call id, tool): an id is one call of one tool, as in Redis, where each tool has its own set.
        self._seen: set[tuple[str, str]] = set()
        self._seen_order: deque[tuple[float, tuple[str, str]]] = deque()
        self._matches: dict[tuple[str, str], bool] = {}

    @property
    def retention_s(self) -> float:
        """How much history is kept; `count` refuses a longer window."""
        return self._retention_s

    def record(self, tool: str, run: RunContext, call_id: str, at: float) -> None:
        """File one call of `tool` under its tenant, principal, run and "global"; once per `call_id` and `tool`."""
        buckets = (("tenant", run.tenant), ("principal", run.principal), ("run", run.run_id), ("global", None))
        with self._lock:
            self._maybe_sweep()
            seen = (call_id, tool)
            if seen in self._seen:
                return
            self._seen.add(seen)
            self._seen_order.append((at, seen))
            for bucket in buckets:
                tools = self._buckets.get(bucket)
                if tools is None:
                    tools = self._buckets[bucket] = {}
                times = tools.get(tool)
                if times is None:
                    tools[tool] = [at]
                elif times[-1] <= at:
                    times.append(at)
                else:  # threads may record slightly out of order
                    bisect.insort(times, at)

    def count(self, tool_glob: str, key: str, run: RunContext, window_s: float, at: float) -> int:
        """See `CallCounter.count`."""
        bucket = (key, _key_value(key, run))
        _check_window(window_s, self._retention_s)
        since = at - window_s
        with self._lock:
            self._maybe_sweep()
            tools = self._buckets.get(bucket)
            if tools is None:
                return 0
            if not _is_glob(tool_glob):
                times = tools.get(tool_glob)
                return 0 if times is None else len(times) - bisect.bisect_right(times, since)
            total = 0
            for tool, times in tools.items():
                if self._matches_glob(tool_glob, tool):
                    total += len(times) - bisect.bisect_right(times, since)
            return total

    def footprint(self) -> Footprint:
        """What is held now (after a sweep, if one is due): for tests and for operators' metrics."""
        with self._lock:
            self._maybe_sweep()
            tools = [times for by_tool in self._buckets.values() for times in by_tool.values()]
            return Footprint(buckets=len(tools), timestamps=sum(map(len, tools)), call_ids=len(self._seen))

    def _matches_glob(self, glob: str, tool: str) -> bool:
        found = self._matches.get((glob, tool))
        if found is None:
            if len(self._matches) > 4096:  # tool names and globs are few; this only bounds a misuse
                self._matches.clear()
            found = self._matches[(glob, tool)] = fnmatch.fnmatchcase(tool, glob)
        return found

    def _maybe_sweep(self) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every_s
        horizon = now - self._retention_s
        seen, order = self._seen, self._seen_order
        while order and order[0][0] < horizon:
            seen.discard(order.popleft()[1])
        for bucket, tools in list(self._buckets.items()):
            for tool, times in list(tools.items()):
                if times[-1] < horizon:
                    del tools[tool]
                elif times[0] < horizon:
                    del times[: bisect.bisect_left(times, horizon)]
            if not tools:
                del self._buckets[bucket]


_RECORD: Final = """
-- KEYS: per bucket, its sorted set of this tool's calls and its set of tools.
-- ARGV: call id, time, trim below (exclusive), retention in ms, tool.
for i = 1, #KEYS, 2 do
  redis.call('ZADD', KEYS[i], 'NX', ARGV[2], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[3])
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
  redis.call('SADD', KEYS[i + 1], ARGV[5])
  redis.call('PEXPIRE', KEYS[i + 1], ARGV[4])
end
"""
"""One call filed in its four buckets: one round trip, one short script (faster than a pipeline of
its twenty commands: the pipeline's commands are packed and parsed one by one)."""


def _token(value: str | None) -> str:
    # Percent-encoding leaves no ":" in a token, so the parts of a key cannot run into each other;
    # "=" marks a value and "-" a missing one, so None, "" and "None" stay three buckets.
    return "-" if value is None else "=" + urllib.parse.quote(value, safe="")


class RedisCounter:
    """A `CallCounter` in Redis, shared by every gate process that uses the same Redis and prefix.

    Per (key, key value, tool) a sorted set of call ids scored by time (so recording an id twice
    counts once); per (key, key value) a set of the tools seen. Every key expires `retention_s`
    after its last record, and each record trims its sorted sets to `retention_s` before `at`.

    Blocking: each call does its round trips on the calling thread (in the gate, a sync interceptor
    runs on the event loop's thread): `record` one (a short Lua script), `count` one for an exact
    tool name, two for a glob (the bucket's tools, then their counts in one pipeline). Each is
    bounded by `timeout_s`. For one Redis server (replicas are fine), not Redis Cluster: a call's
    keys span hash slots.

    Raises: a Redis that is down raises `redis.exceptions.ConnectionError`, one that does not answer
    in `timeout_s` `redis.exceptions.TimeoutError` (both `RedisError`); neither is swallowed, so the
    interceptor or policy asking fails and the gate fails closed: the call is denied.
    Safe from several threads (the `redis` client's connection pool).

    `client` (a `redis.Redis`) replaces the one built from `url`; `close()` then leaves it open.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "callgate:calls:",
        client: redis.Redis | None = None,
        retention_s: float = DEFAULT_RETENTION_S,
        timeout_s: float = 1.0,
    ) -> None:
        import redis as redis_lib  # the core imports no transport until one is asked for

        if not isinstance(prefix, str):
            raise ConfigurationError(f"prefix must be a string, got {prefix!r}")
        self._retention_s = _check_retention(retention_s)
        self._retention_ms = max(1, math.ceil(self._retention_s * 1000))
        self._prefix = prefix
        self._owns_client = client is None
        self._client: redis.Redis = (
            client
            if client is not None
            else redis_lib.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        )
        self._record = self._client.register_script(_RECORD)  # loaded on first use, again if Redis lost it

    @property
    def retention_s(self) -> float:
        """How much history is kept; `count` refuses a longer window."""
        return self._retention_s

    def record(self, tool: str, run: RunContext, call_id: str, at: float) -> None:
        """File one call under its tenant, principal, run and "global": one round trip."""
        tool_token = urllib.parse.quote(tool, safe="")
        keys: list[str] = []
        for key in KEYS:
            bucket = self._bucket(key, _key_value(key, run))
            keys += (f"{bucket}:t:{tool_token}", f"{bucket}:tools")
        self._record(keys=keys, args=[call_id, repr(at), f"({at - self._retention_s!r}", self._retention_ms, tool])

    def count(self, tool_glob: str, key: str, run: RunContext, window_s: float, at: float) -> int:
        """See `CallCounter.count`; one round trip for an exact tool name, two for a glob."""
        bucket = self._bucket(key, _key_value(key, run))
        _check_window(window_s, self._retention_s)
        since, until = f"({at - window_s!r}", "+inf"
        if not _is_glob(tool_glob):
            tools = [tool_glob]
        else:
            seen = self._client.smembers(f"{bucket}:tools")
            names = (name.decode() if isinstance(name, bytes) else str(name) for name in seen)
            tools = [name for name in names if fnmatch.fnmatchcase(name, tool_glob)]
            if not tools:
                return 0
        pipe = self._client.pipeline(transaction=False)
        for tool in tools:
            pipe.zcount(f"{bucket}:t:{urllib.parse.quote(tool, safe='')}", since, until)
        return sum(int(n) for n in pipe.execute())

    def close(self) -> None:
        """Close the connections of the client this counter built (not of one it was given)."""
        if self._owns_client:
            self._client.close()

    def _bucket(self, key: str, value: str | None) -> str:
        return f"{self._prefix}{key}:{_token(value)}"


_PER_KEY: Final[dict[str, str]] = {
    "tenant": "per tenant",
    "principal": "per principal",
    "run": "per run",
    "global": "across all runs",
}


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g} {unit}"
    return f"{seconds:g} s"


class RateLimit:
    """An interceptor allowing `limit` calls per `window_s`, by `key`, of the tools matching `tool_glob`.

    For a matching call it records the call in `counter`, then denies it when the count in the
    window (this call included) is above `limit`: the first `limit` calls in a window pass, the
    next are denied, and denied calls count too (every call that reached the check is counted).
    Calls of other tools are neither recorded nor counted.

    `counter` defaults to a new `InProcessCounter` (this process only); pass a `RedisCounter` for a
    limit shared by several processes (its `retention_s` must cover `window_s`). `clock` gives each
    call's time. Sync, and blocking as its counter is; a counter that raises (Redis down) makes the
    gate fail closed. Safe from several threads. Configuration is checked here, when the limit is
    built: `ConfigurationError` names the bad argument.
    """

    def __init__(
        self,
        tool_glob: str,
        *,
        limit: int,
        window_s: float,
        key: str = "tenant",
        counter: CallCounter | None = None,
        name: str = "rate-limit",
        mandatory: bool = False,
        message: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        name = check_identity(name, mandatory)
        if not isinstance(tool_glob, str) or not tool_glob:
            raise ConfigurationError(f"tool_glob must be a non-empty string, got {tool_glob!r}", interceptor=name)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit must be a non-negative integer, got {limit!r}", interceptor=name)
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) or not 0 < window_s < math.inf:
            raise ConfigurationError(
                f"window_s must be a positive number of seconds, got {window_s!r}", interceptor=name
            )
        if key not in KEYS:
            raise ConfigurationError(f"key must be one of {', '.join(KEYS)}, got {key!r}", interceptor=name)
        if counter is None:
            # Its own counter answers one window only: keeping more would be memory for nothing.
            counter = InProcessCounter(clock=clock, retention_s=window_s)
        elif not (callable(getattr(counter, "record", None)) and callable(getattr(counter, "count", None))):
            raise ConfigurationError(f"counter {counter!r} has no record and count methods", interceptor=name)
        elif not window_s <= getattr(counter, "retention_s", math.inf):
            raise ConfigurationError(
                f"window_s={window_s!r} is longer than counter {counter!r} keeps (retention_s={counter.retention_s!r})",
                interceptor=name,
            )
        if message is not None and not isinstance(message, str):
            raise ConfigurationError(f"message must be a string, got {message!r}", interceptor=name)
        self.name = name
        self.mandatory = mandatory
        self.tool_glob = tool_glob
        self.limit = limit
        self.window_s = float(window_s)
        self.key = key
        self.counter = counter
        self._clock = clock
        self._message = message
        self._applies: dict[str, bool] = {}

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Record a matching call and deny it past the limit; None (allow) otherwise."""
        tool = call.tool_name
        applies = self._applies.get(tool)
        if applies is None:
            applies = self._applies[tool] = fnmatch.fnmatchcase(tool, self.tool_glob)
        if not applies:
            return None
        at = self._clock()
        self.counter.record(tool, call.run, call.call_id, at)
        if self.counter.count(self.tool_glob, self.key, call.run, self.window_s, at) <= self.limit:
            return None
        return Deny(self._message or self._default_message(tool))

    def _default_message(self, tool: str) -> str:
        window = _duration(self.window_s)
        return (
            f"{tool} is limited to {self.limit} calls {_PER_KEY[self.key]} in {window}, and that limit is reached; "
            "wait before calling it again (calls made over the limit count too), or do without it."
        )

    def __repr__(self) -> str:
        return f"RateLimit({self.tool_glob!r}, limit={self.limit}, window_s={self.window_s:g}, key={self.key!r})"
