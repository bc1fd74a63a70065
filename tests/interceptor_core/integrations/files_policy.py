"""The policy the integration tests put in front of the file tools, on every route.

- `delete_file` of precious.txt is denied (the model reads why);
- `write_file` of dry-run.txt is answered with a substitute, nothing written;
- `delete_file` of "*" blocks the run.

Also the `MODULE:FACTORY` of `callgate mcp-proxy` in the proxy tests (`files_policy:build_gate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from interceptor_core import Block, Deny, Gate, Substitute, ToolCall

DENIAL = "precious.txt is protected; it cannot be deleted."
SUBSTITUTE = "dry run: nothing was written"


class ProtectFiles:
    name = "protect-files"

    def before_tool_call(self, call: ToolCall) -> Deny | Substitute | Block | None:
        path = call.args.get("path")
        if call.tool_name.endswith("delete_file") and path == "precious.txt":
            return Deny(DENIAL)
        if call.tool_name.endswith("delete_file") and path == "*":
            return Block("wildcard delete requested")
        if call.tool_name.endswith("write_file") and path == "dry-run.txt":
            return Substitute(SUBSTITUTE)
        return None


def build_gate(sinks: Sequence[Any] = ()) -> Gate:
    return Gate("files", interceptors=[ProtectFiles()], sinks=sinks)


def build_drill_gate(sinks: Sequence[Any] = ()) -> Gate:
    """The same gate under the deny-all drill for the life of the process (the proxy's drill route)."""
    from interceptor_core.testing import deny_all

    gate = build_gate(sinks)
    deny_all(gate).start()
    return gate
