"""What the command line needs to start a local service and know when it serves."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request


def wait_until_serving(
    url: str, process: subprocess.Popen[bytes], timeout_s: float, *, require_ok: bool = False
) -> None:
    """Block until `url` answers over HTTP (with 200 when `require_ok`, any status otherwise: a 503
    from a health check still means the server runs).

    Raises `ChildProcessError` when `process` exits first and `TimeoutError` after `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ChildProcessError(f"exited with code {process.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (a local http URL the caller built)
                if not require_ok or response.status == 200:
                    return
        except urllib.error.HTTPError:
            if not require_ok:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.1)  # polling a child process with a deadline
    raise TimeoutError(f"did not answer at {url} within {timeout_s:.0f} s")
