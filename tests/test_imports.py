"""The direction of imports: the core loads no transport, and no module imports itself back."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

HEAVY = (
    "aiokafka",
    "duckdb",
    "opentelemetry",
    "streamlit",
    # The integrations' libraries: loaded by interceptor_core.integrations.<name> only.
    "mcp",
    "mcp_types",
    "langchain_core",
    "agents",
    "openai",
    "pydantic_ai",
    "jsonschema",
)


@pytest.mark.parametrize(
    "package",
    ["interceptor_core", "interceptor_core.testing", "interceptor_core.integrations", "events", "callgate.demo"],
)
def test_core_imports_no_transport(package: str) -> None:
    """Importing the package in a fresh interpreter loads no transport and no integration's library."""
    code = f"import sys, {package}; print(' '.join(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == ""


def test_the_check_would_see_a_transport() -> None:
    """The same probe reports a transport when one is imported (so the test above can fail)."""
    code = "import sys, duckdb; print(' '.join(m for m in sys.modules if m.split('.')[0] == 'duckdb'))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "duckdb" in loaded


def test_the_store_and_the_dashboard_never_import_the_gate() -> None:
    """`events` <- `consumers` <- `dashboard` stays apart from `interceptor_core`: importing every
    module of the store and the dashboard's data layer loads no gate module."""
    import pkgutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    modules = [f"consumers.{m.name}" for m in pkgutil.iter_modules([str(root / "consumers")])]
    modules += ["dashboard.data", "dashboard.config"]
    code = f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; " + (
        "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'interceptor_core'))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == ""


# -- no import circles ----------------------------------------------------------------------------

PACKAGES = ("interceptor_core", "events", "consumers", "dashboard", "callgate")


def _modules(root: Path, packages: Sequence[str]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports anywhere in its code (at the top, inside functions,
    in `try` blocks), except under `if TYPE_CHECKING:`."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path))]
    while pending:
        node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                pending.extend(child.orelse)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names if alias.name in modules)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                target = ".".join([*base, *([child.module] if child.module else [])])
                for alias in child.names:
                    submodule = f"{target}.{alias.name}"
                    if submodule in modules:
                        found.add(submodule)
                    elif target in modules:
                        found.add(target)
            pending.append(child)
    found.discard(name)
    return found


def import_circles(root: Path, packages: Sequence[str]) -> list[list[str]]:
    """The groups of modules that import one another in a circle (strongly connected components of
    more than one module), each sorted; empty when every package's modules stand in one order."""
    modules = _modules(root, packages)
    graph = {name: sorted(_imports(name, path, modules)) for name, path in modules.items()}
    # Tarjan's algorithm, iterative (no recursion limit on long chains).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for position in range(at, len(graph[node])):
                nxt = graph[node][position]
                if nxt not in index:
                    work.append((node, position + 1))
                    work.append((nxt, 0))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        circles.append(sorted(group))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return sorted(circles)


def test_no_import_circles() -> None:
    """No module of the project imports, directly or through others, a module that imports it back,
    counting imports deferred into functions (only `if TYPE_CHECKING:` imports are left out)."""
    root = Path(__file__).resolve().parents[1]
    assert import_circles(root, PACKAGES) == []


def test_the_circle_check_sees_a_deferred_circle(tmp_path: Path) -> None:
    """A circle closed by an import inside a function, through a third module and a relative import,
    is reported; the same import under `if TYPE_CHECKING:` is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg.high import g\n    return g\n")
    (package / "mid.py").write_text("from . import low\n")
    (package / "high.py").write_text("from pkg.mid import low\n\ndef g():\n    return 1\n")
    (package / "other.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import g\nimport pkg.low\n"
    )
    assert import_circles(tmp_path, ["pkg"]) == [["pkg.high", "pkg.low", "pkg.mid"]]
