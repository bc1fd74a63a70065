"""Built-in checks: each a plain function (what a policy file calls) and an interceptor class.

- `within(path, roots, *, base=None)` / `PathsWithin`: paths stay inside allowed directories,
  after `..`, symlinks and relative forms are resolved.
- `host_in(url, hosts)` / `HostAllowList`: a URL in the one plain form every HTTP client reads
  alike, whose host is on an allow-list (any other spelling is refused).
- `sql_writes(query, *, dialect=None, safe_functions=())` / `ReadOnlySQL`: SQL text that may write,
  or calls a function not known to be free of effects, parsed with sqlglot.
- `has_secrets(value, *, redactor=None)` / `NoSecrets`: a value holds what the audit redactor
  would redact.
- `KEYS`, `CallCounter`, `InProcessCounter`, `RedisCounter`, `RateLimit`, `shared_counter`: call
  counts per window (`interceptor_core.builtins.counters`); policies of one name share one count
  per process.

Each function never raises for the model's value (a value it cannot judge is judged unsafe) and
raises `TypeError` or `ValueError` for a bad argument of the policy author's; each interceptor
checks its configuration when built (`ConfigurationError`) and denies with a `Deny` that says
what to do instead.
"""

from interceptor_core.builtins.counters import (
    KEYS,
    CallCounter,
    InProcessCounter,
    RateLimit,
    RedisCounter,
    shared_counter,
)
from interceptor_core.builtins.paths import PathsWithin, within
from interceptor_core.builtins.secrets import NoSecrets, has_secrets
from interceptor_core.builtins.sql import ReadOnlySQL, sql_writes
from interceptor_core.builtins.urls import HostAllowList, host_in

__all__ = [
    "KEYS",
    "CallCounter",
    "HostAllowList",
    "InProcessCounter",
    "NoSecrets",
    "PathsWithin",
    "RateLimit",
    "ReadOnlySQL",
    "RedisCounter",
    "has_secrets",
    "host_in",
    "shared_counter",
    "sql_writes",
    "within",
]
