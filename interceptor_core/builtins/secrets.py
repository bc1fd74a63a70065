"""Does a value hold a secret? `has_secrets` answers; `NoSecrets` denies calls whose arguments do.

The secrets are the ones the audit trail's `Redactor` (events.redaction) redacts, found by the
same detectors and the same secret-key rule, so a value this check lets through is a value the
redactor would have left whole, and the reverse.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from events.redaction import Redactor
from interceptor_core.builtins._config import check_identity, field_names, tool_matcher
from interceptor_core.context import ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

__all__ = ["NoSecrets", "has_secrets"]


def has_secrets(value: Any, *, redactor: Redactor | None = None) -> bool:
    """True when `redactor` (default: a shared `Redactor()`) would find a secret anywhere in `value`.

    Looked at: every string, every mapping key (as text), every number as its decimal text (a card
    number sent as an int), bytes decoded as UTF-8, and what a pydantic model, a dataclass, a set or
    any other object holds (its fields, its items, else its `str()`), at any depth. A string holds a
    secret when one of the redactor's content detectors finds a span in it (API keys and tokens,
    JWTs, private key blocks, Luhn-valid card numbers, credentials in URLs, ...). A mapping key that
    the redactor's secret-key rule marks (`password`, `api_key`, `Authorization`, ...: see
    `events.redaction.DEFAULT_SECRET_KEYS`) makes its value a secret when that value holds anything:
    a string (or bytes) that is not blank, or a number, itself or anywhere inside. None, booleans,
    blank strings and containers of nothing else under such a key are not secrets: the redactor
    would replace them, but they reveal nothing. The rule also matches counters such as
    `max_tokens`; build the redactor with `secret_keys=` to narrow it. The redactor's per-tool
    `paths` are not used (this check does not know a tool), and a disabled redactor finds nothing.

    Never raises: a value that cannot be looked at whole (a detector that fails, an object whose
    `str()` raises) counts as holding a secret. No I/O; the default redactor's detectors are built on
    first use (about a tenth of a second, once). Safe from several threads.
    """
    chosen = _default_redactor() if redactor is None else redactor
    try:
        return _holds_secret(value, chosen)
    except Exception:
        return True  # fail closed: what could not be scanned may hold anything


class NoSecrets:
    """Denies a call whose arguments hold a secret (see `has_secrets`), without repeating it.

    `fields` names the arguments to look at (None: all of them); an argument the tool does not have
    is skipped. Each argument is judged with its name, so the secret-key rule applies to argument
    names too: a non-empty `password` argument is a secret. `tools` restricts the check to the tools
    matching one of its globs (`fnmatch.fnmatchcase`; None: every tool). `redactor` defaults to a
    shared `Redactor()`; give the gate's own to stay in step with the audit trail. The denial names
    the tool and the arguments holding secrets, never their values.

    Sync, no I/O; safe from several threads. `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        *,
        tools: str | Sequence[str] | None = None,
        fields: str | Sequence[str] | None = None,
        name: str = "no-secrets",
        mandatory: bool = False,
        redactor: Redactor | None = None,
    ) -> None:
        self.name = check_identity(name, mandatory)
        self.mandatory = mandatory
        self.fields = None if fields is None else field_names(fields, interceptor=name)
        if redactor is not None and not isinstance(redactor, Redactor):
            raise ConfigurationError(f"redactor must be an events.Redactor, got {redactor!r}", interceptor=name)
        self.redactor = _default_redactor() if redactor is None else redactor
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a looked-at argument holds a secret; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        args = call.args
        fields = args.keys() if self.fields is None else [field for field in self.fields if field in args]
        found = [field for field in fields if has_secrets({field: args[field]}, redactor=self.redactor)]
        if not found:
            return None
        which = ", ".join(map(repr, found))
        return Deny(
            f"{tool}: {'argument' if len(found) == 1 else 'arguments'} {which} "
            f"{'holds' if len(found) == 1 else 'hold'} what looks like a secret (a key, token, password, private "
            "key or card number), and this tool may not be sent secrets. Call it again without the secret; "
            "do not repeat it."
        )

    def __repr__(self) -> str:
        return f"NoSecrets(fields={self.fields!r}, name={self.name!r})"


@functools.cache
def _default_redactor() -> Redactor:
    return Redactor()


def _holds_secret(value: Any, redactor: Redactor) -> bool:
    # A stack rather than recursion: a value nested deeper than the recursion limit is still scanned.
    pending: list[Any] = [value]
    # Containers met before (a cycle, or shared), kept alive so that a fresh model_dump() dict cannot
    # take the id of one already freed and be skipped.
    seen: dict[int, Any] = {}
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _text_holds_secret(item, redactor):
                return True
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int):
            # As the redactor does: past 64 bits a number is longer than any secret a detector looks for.
            if item.bit_length() <= 64 and _text_holds_secret(str(int(item)), redactor):
                return True
        elif isinstance(item, float):
            if _text_holds_secret(repr(item), redactor):
                return True
        elif isinstance(item, bytes | bytearray | memoryview):
            if _text_holds_secret(bytes(item).decode("utf-8", "replace"), redactor):
                return True
        elif id(item) in seen:
            continue
        elif isinstance(item, Mapping):
            seen[id(item)] = item
            for key, inner in item.items():
                key_text = key if isinstance(key, str) else str(key)
                if _text_holds_secret(key_text, redactor):
                    return True
                if _is_secret_key(key_text, redactor) and _holds_anything(inner):
                    return True
                pending.append(inner)
        else:
            seen[id(item)] = item
            pending.extend(_contents(item))
    return False


def _contents(item: Any) -> list[Any]:
    """What a value that is not a str, number, bytes or mapping holds, to be looked at in turn."""
    if isinstance(item, list | tuple | set | frozenset):
        return list(item)
    if isinstance(item, BaseModel):
        return [item.model_dump()]
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return [{field.name: getattr(item, field.name) for field in dataclasses.fields(item)}]
    return [str(item)]


def _text_holds_secret(text: str, redactor: Redactor) -> bool:
    # redact_text returns its input unchanged when no detector finds anything, and fails closed
    # (returns REDACTED) when one raises.
    return redactor.redact_text(text) != text


def _is_secret_key(key: str, redactor: Redactor) -> bool:
    """Does the redactor's secret-key rule mark `key`?

    The rule is only public through `redact_args`: a one-key probe, nested one level down so that a
    per-tool path (a top-level JSON pointer) cannot be mistaken for it. The redactor remembers its
    key decisions, so a repeated key costs little.
    """
    return bool(redactor.redact_args("", {"": {key: None}}).redacted_paths)


def _holds_anything(value: Any) -> bool:
    """Does `value` hold what a secret could be: a non-blank string or bytes, or a number, at any depth?"""
    pending: list[Any] = [value]
    seen: dict[int, Any] = {}
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if item.strip():
                return True
        elif isinstance(item, bytes | bytearray | memoryview):
            if bytes(item).strip():
                return True
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int | float):
            return True
        elif id(item) in seen:
            continue
        elif isinstance(item, Mapping):
            seen[id(item)] = item
            pending.extend(item.values())
        else:
            seen[id(item)] = item
            pending.extend(_contents(item))
    return False
