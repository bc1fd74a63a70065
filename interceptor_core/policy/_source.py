"""Reading a policy file: YAML into plain values that remember the line each key was on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy file: where (file, 1-based line, rule id) and what."""

    source: str
    line: int | None
    rule: str | None
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where} {self.rule or '(policy)'}: {self.message}"


class Located(dict[str, Any]):
    """A YAML mapping as a dict, with the line of the mapping and of each of its keys."""

    line: int
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        """The line `key` is on, or the mapping's own line when it is absent."""
        return self.key_lines.get(key, self.line)


class SourceError(Exception):
    """The text is not YAML we read: its problems, each with a line."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


class _Loader(yaml.SafeLoader):
    """YAML 1.1's safe loader, with only `true` and `false` read as booleans.

    Plain YAML 1.1 reads `no`, `off`, `yes` and `on` as booleans, so `message: no` or a tool called
    `on` would silently become `False` or `True`; in a policy file they stay text.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_yaml(text: str, source: str) -> Any:
    """Parse `text` (one YAML document) into dicts, lists and scalars; mappings are `Located`.

    Raises `SourceError` for YAML that does not parse, several documents, tags that are not plain
    data, and a key given twice in one mapping (which plain YAML loaders silently resolve).
    """
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise SourceError([Problem(source, line, None, f"not valid YAML: {exc.problem}")]) from None
    except yaml.YAMLError as exc:
        raise SourceError([Problem(source, None, None, f"not valid YAML: {exc}")]) from None
    if node is None:
        return None
    problems: list[Problem] = []
    value = _build(node, source, problems, SafeConstructor())
    if problems:
        raise SourceError(problems)
    return value


def _build(node: Node, source: str, problems: list[Problem], constructor: SafeConstructor) -> Any:
    line = node.start_mark.line + 1
    if isinstance(node, MappingNode):
        out = Located()
        out.line = line
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = _build(key_node, source, problems, constructor)
            if not isinstance(key, str):
                problems.append(Problem(source, key_node.start_mark.line + 1, None, f"key {key!r} is not a string"))
                continue
            if key in out:
                problems.append(
                    Problem(source, key_node.start_mark.line + 1, None, f"key {key!r} is given twice in one mapping")
                )
                continue
            out.key_lines[key] = key_node.start_mark.line + 1
            out[key] = _build(value_node, source, problems, constructor)
        return out
    if isinstance(node, SequenceNode):
        return [_build(item, source, problems, constructor) for item in node.value]
    if isinstance(node, ScalarNode):
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problems.append(Problem(source, line, None, f"value not read: {exc}"))
            return None
    problems.append(Problem(source, line, None, "unsupported YAML node"))
    return None
