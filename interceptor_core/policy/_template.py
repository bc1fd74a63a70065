"""Message templates: text with `{args.order_id}`-style fields over the policy's variables."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from interceptor_core.policy._cel import FIELDS, VARIABLES

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
MISSING = "(none)"
"""What a field with no value renders as (an optional argument left out, a run without a tenant)."""


class TemplateError(ValueError):
    """A template that cannot be read, or that names a variable or field that does not exist."""


class Template:
    """A message template, parsed once. `{{` and `}}` stand for literal braces.

    Raises `TemplateError` at construction for an unbalanced brace, a field that is not a dotted
    name, an unknown variable (`{user.id}`) or an unknown field of `run` or `scope`. Fields of
    `args` are listed in `args_fields`, for checking against the tools the policy is used with.
    """

    __slots__ = ("args_fields", "parts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[str | tuple[str, ...]] = []
        args_fields: set[str] = set()
        literal: list[str] = []
        position = 0
        for match in _TOKEN.finditer(text):
            literal.append(text[position : match.start()])
            position = match.end()
            token = match.group(0)
            if token in ("{{", "}}"):
                literal.append(token[0])
                continue
            if match.group(1) is None:
                raise TemplateError(f"unbalanced {token!r} in message (write {token * 2} for a literal brace)")
            path = match.group(1).strip()
            if not _PATH.fullmatch(path):
                raise TemplateError(f"{{{match.group(1)}}} is not a field name such as {{args.order_id}}")
            names = tuple(path.split("."))
            if names[0] not in VARIABLES:
                raise TemplateError(
                    f"{{{path}}} names {names[0]!r}, which is no variable (there are: {', '.join(VARIABLES)})"
                )
            known = FIELDS[names[0]]
            if len(names) > 1:
                if names[0] == "args":
                    args_fields.add(names[1])
                elif known is not None and names[1] not in known:
                    raise TemplateError(
                        f"{{{path}}}: {names[0]} has no field {names[1]!r} "
                        f"(it has: {', '.join(sorted(known)) or 'none'})"
                    )
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(names)
        literal.append(text[position:])
        if "".join(literal):
            parts.append("".join(literal))
        self.parts = tuple(parts)
        self.args_fields = frozenset(args_fields)

    def render(self, data: Mapping[str, Any]) -> str:
        """The text with each field's value: strings as they are, other values as JSON, a missing
        field or null as `(none)`. Never raises."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value: Any = data
            for name in part:
                value = value.get(name) if isinstance(value, Mapping) else None
            if value is None:
                out.append(MISSING)
            elif isinstance(value, str):
                out.append(value)
            else:
                out.append(json.dumps(value, default=str, ensure_ascii=False))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"
