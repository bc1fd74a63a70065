"""`callgate mcp-proxy` over stdio with a grace of its own, as a process: what the command line
runs, with `run_proxy(..., grace_s=)` (the command line keeps the default of 30 s).

    python short_grace_proxy.py EVENTS GRACE_S -- UPSTREAM COMMAND...
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from callgate.mcp_proxy import build_proxy_gate, build_sinks, run_proxy

if __name__ == "__main__":
    events, grace_s, separator, *upstream = sys.argv[1:]
    if separator != "--":
        sys.exit("usage: short_grace_proxy.py EVENTS GRACE_S -- UPSTREAM COMMAND...")
    gate = build_proxy_gate("files_policy:build_gate", [], build_sinks(Path(events), None, "callgate", None))
    sys.exit(asyncio.run(run_proxy(gate, upstream, grace_s=float(grace_s))))
