"""The direction of imports: the core loads no transport."""

from __future__ import annotations

import subprocess
import sys

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
