"""The policy the integration tests put in front of the file tools, on every route.

- any call whose path argument (`path`, `paths`, `source`, `destination`) names precious.txt, in
  any spelling (`./precious.txt`, `sub/../precious.txt`, its absolute path), is denied (the model
  reads why): judged with the path built-in (`interceptor_core.builtins.within`) against the files
  root the upstream resolves paths in, never by comparing strings;
- `write_file` of dry-run.txt is answered with a substitute, nothing written;
- `delete_file` of "*" blocks the run.

Also the `MODULE:FACTORY` of `callgate mcp-proxy` in the proxy tests (`files_policy:build_gate`,
taking `sinks=`; `build_plain_gate` takes none, as users write it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from interceptor_core import Block, Deny, Gate, Substitute, ToolCall
from interceptor_core.builtins import within

DENIAL = "precious.txt is protected; it cannot be deleted."
PROTECTED = "precious.txt is protected; no tool may use it."
SUBSTITUTE = "dry run: nothing was written"
PATH_ARGUMENTS = ("path", "paths", "source", "destination")


class ProtectFiles:
    """`root`: the directory the tools resolve relative paths in (default: $UPSTREAM_ROOT, the
    real MCP server's, else the current directory)."""

    name = "protect-files"

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = os.fspath(root) if root is not None else os.environ.get("UPSTREAM_ROOT")
        self.protected = os.path.join(self.root or os.getcwd(), "precious.txt")

    def touches_protected(self, call: ToolCall) -> bool:
        for field in PATH_ARGUMENTS:
            value = call.args.get(field)
            for path in value if isinstance(value, list) else [value]:
                # within() of the protected file itself: true for every spelling that reaches it.
                if path is not None and within(path, [self.protected], base=self.root):
                    return True
        return False

    def before_tool_call(self, call: ToolCall) -> Deny | Substitute | Block | None:
        path = call.args.get("path")
        if call.tool_name.endswith("delete_file") and path == "*":
            return Block("wildcard delete requested")
        if self.touches_protected(call):
            return Deny(DENIAL if call.tool_name.endswith("delete_file") else PROTECTED)
        if call.tool_name.endswith("write_file") and path == "dry-run.txt":
            return Substitute(SUBSTITUTE)
        return None


def build_gate(sinks: Sequence[Any] = ()) -> Gate:
    return Gate("files", interceptors=[ProtectFiles()], sinks=sinks)


def build_plain_gate() -> Gate:
    """A factory as users write it: no sinks= (the proxy adds its own)."""
    return Gate("files", interceptors=[ProtectFiles()])


def build_drill_gate(sinks: Sequence[Any] = ()) -> Gate:
    """The same gate under the deny-all drill for the life of the process (the proxy's drill route)."""
    from interceptor_core.testing import deny_all

    gate = build_gate(sinks)
    deny_all(gate).start()
    return gate
