"""The README's tour runs as written and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_tour_runs_and_prints_what_it_claims() -> None:
    """Every '# kind text' comment in the tour matches the line the code prints."""
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
    printed = out.getvalue().splitlines()
    claims = [c.strip() for c in re.findall(r"# ((?:ok|denied) .*)", code.group(1))]
    assert len(printed) == len(claims) == 2
    for line, claim in zip(printed, claims, strict=True):
        prefix = claim.split("...")[0]
        assert line.startswith(prefix), (line, claim)
    assert printed[1] == "denied Order GLOBEX-9 does not belong to tenant acme."
