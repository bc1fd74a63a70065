"""Build the topic test's Go reader (src/consume) against Debian's Sarama in GOPATH mode: nothing is
downloaded, every package comes from /usr/share/gocode. Go's build cache keeps the compiled Sarama
and its cgo zstd binding, so `make venv` runs this once (about 20 s) and the test's own build takes
about a second.

Usage: python build.py OUTPUT
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(output: Path | str) -> subprocess.CompletedProcess[bytes]:
    """Run `go build` for the reader into `output`; the finished process (stderr captured)."""
    go = shutil.which("go")
    if go is None:
        raise FileNotFoundError("go is missing: `make venv` installs Debian's golang-go and Sarama")
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"/usr/share/gocode:{HERE}",
        "GOFLAGS": "",
        # libzstd 1.5 marks a function the binding still calls as deprecated: not ours to fix.
        "CGO_CFLAGS": "-O2 -Wno-deprecated-declarations",
    }
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    return subprocess.run(
        [go, "build", "-o", str(output), "consume"], capture_output=True, env=env, timeout=600, check=False
    )


if __name__ == "__main__":
    done = build(sys.argv[1])
    sys.stderr.buffer.write(done.stderr)
    sys.exit(done.returncode)
