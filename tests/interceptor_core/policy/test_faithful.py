"""A policy judges exactly the value the tool receives: what the CEL engine cannot hold whole (a NUL
ends its strings; a lone surrogate and an integer beyond 64 bits it refuses) fails the rules reading
it closed, and the policy-file route of each built-in agrees with its Python route on any string."""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interceptor_core import Gate, RunContext, tool
from interceptor_core.builtins import has_secrets, host_in, sql_writes, within
from interceptor_core.decisions import Allow, Deny
from interceptor_core.policy import Policy

RUN = RunContext(tenant="acme", principal="u-1")


def policy(rules: str, *, default: str = "allow") -> Policy:
    text = f"version: 1\nname: p\ndefault: {default}\nrules:\n" + textwrap.indent(textwrap.dedent(rules), "  ")
    return Policy.from_text(text)


class TestValuesSeenWhole:
    def test_a_string_with_a_nul_is_not_judged_by_its_first_part(self) -> None:
        """`size(args.s) < 5` allowed "ab\\0cdefgh" when the engine saw "ab"; now the allow rule
        cannot match and the default denies, with the reason in the trail."""
        check = policy(
            """
            - id: short-only
              when: "size(args.s) < 5"
              decision: allow
            """,
            default="deny",
        )
        result = check.evaluate("t", {"s": "ab\0cdefgh"}, RUN)
        assert isinstance(result.decision, Deny)
        assert result.error is not None
        assert "args.s holds a NUL character" in result.error
        assert isinstance(check.evaluate("t", {"s": "abc"}, RUN).decision, Allow)

    def test_a_deny_rule_reading_an_unheld_value_counts_as_matched(self) -> None:
        """A deny rule fails closed: the call is denied whatever the rule would have said."""
        check = policy(
            """
            - id: no-etc
              when: "args.path.startsWith('/etc')"
              decision: deny
            """
        )
        assert isinstance(check.evaluate("t", {"path": "/srv/x\0/../../etc/passwd"}, RUN).decision, Deny)
        assert isinstance(check.evaluate("t", {"path": "/srv/x"}, RUN).decision, Allow)

    @pytest.mark.parametrize(
        ("args", "where"),
        [
            ({"paths": ["/srv/ok", "/srv/x\0/../../etc"]}, "args.paths[1] holds a NUL"),
            ({"meta": {"note": "a\0b"}}, "args.meta.note holds a NUL"),
            ({"meta": {"k\0": 1}}, "a key of args.meta holds a NUL"),
            ({"s": "\ud800"}, "args.s holds a lone surrogate"),
            ({"n": 2**70}, "args.n holds an integer beyond 64 bits"),
        ],
    )
    def test_nested_values_keys_and_numbers_are_checked(self, args: dict[str, Any], where: str) -> None:
        """A value inside a list or an object, a key, text that is not Unicode, a huge integer."""
        check = policy(
            """
            - id: anything
              when: "size(args) > 100"
              decision: deny
            """
        )
        result = check.evaluate("t", args, RUN)
        assert isinstance(result.decision, Deny)
        assert where in (result.error or "")

    def test_a_rule_that_reads_no_arguments_still_decides(self) -> None:
        """Only the rules reading the unheld value fail closed; a rule on the tool alone is evaluated."""
        check = policy(
            """
            - id: only-reads
              when: "tool != 'read'"
              decision: deny
            """
        )
        assert isinstance(check.evaluate("read", {"s": "a\0b"}, RUN).decision, Allow)
        assert isinstance(check.evaluate("write", {"s": "a\0b"}, RUN).decision, Deny)

    def test_run_values_are_checked_too(self) -> None:
        """A NUL in the run's metadata fails the rules reading `run`."""
        check = policy(
            """
            - id: vip-only
              when: "run.metadata.tier != 'vip'"
              decision: deny
            """
        )
        odd = RunContext(tenant="acme", metadata={"tier": "vip\0not"})
        result = check.evaluate("t", {}, odd)
        assert isinstance(result.decision, Deny)
        assert "run.metadata.tier holds a NUL" in (result.error or "")

    async def test_through_a_gate_the_tool_never_runs_on_an_unheld_value(self) -> None:
        """The policy as an interceptor: the tool body does not run, and the trail says why."""
        ran: list[str] = []

        @tool
        def read_file(path: str) -> str:
            """Reads a file."""
            ran.append(path)
            return "contents"

        check = policy(
            """
            - id: inside-srv
              when: "!args.path.startsWith('/srv/work/')"
              decision: deny
            """
        )
        desk = Gate("g", interceptors=[check]).agent("a", tools=[read_file])
        result = await desk.call("read_file", {"path": "/srv/work/x\0/../../../etc/passwd"})
        assert result.kind == "denied"
        assert ran == []
        assert (await desk.call("read_file", {"path": "/srv/work/x"})).kind == "ok"
        assert ran == ["/srv/work/x"]


# Adversarial text: NULs, controls, format characters, surrogates, confusables, long runs.
_ODD = st.sampled_from(
    [
        *("\0", "\x01", "\x1f", "\x7f", "\u200b", "\u200d", "\u202e", "\ufeff", "\u2044", "\uff0f", "\u2215"),
        *("\ud800", "\udfff", "\u0430", "\u0441", "\uff0e", "\u3002", "\\", "@", "%00", "%2e%2e", "/..", " ", "\t"),
    ]
)
_TEXT = st.lists(st.one_of(_ODD, st.text(max_size=8)), max_size=12).map("".join)
_LONG = st.integers(min_value=1_000, max_value=20_000).map(lambda n: "a" * n + "\0")
ADVERSARIAL = st.one_of(_TEXT, _LONG)

ROUTES = {
    "within": ("!within(args.value, {roots})", lambda value, roots: not within(value, roots)),
    "host_in": ("!host_in(args.value, ['example.com'])", lambda value, roots: not host_in(value, ["example.com"])),
    "sql_writes": ("sql_writes(args.value, 'postgres')", lambda value, roots: sql_writes(value, dialect="postgres")),
    "has_secrets": ("has_secrets(args)", lambda value, roots: has_secrets({"value": value})),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [os.path.realpath(tmp_path_factory.mktemp("faithful") / "data")]


@pytest.mark.parametrize("builtin", sorted(ROUTES))
def test_the_policy_route_agrees_with_the_python_route_on_any_string(builtin: str, roots: list[str]) -> None:
    """For every adversarial string, prefixed so it may look ordinary, the policy's deny rule fires
    exactly when the Python built-in refuses the value."""
    condition, python = ROUTES[builtin]
    condition = condition.format(roots=str(roots).replace('"', "'"))
    check = policy(f'- id: check\n  when: "{condition}"\n  decision: deny\n')
    prefixes = {
        "within": [roots[0] + "/", ""],
        "host_in": ["https://example.com/", "https://", ""],
        "sql_writes": ["SELECT 1 -- ", "SELECT '", ""],
        "has_secrets": ["note: ", ""],
    }[builtin]

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(prefix=st.sampled_from(prefixes), text=ADVERSARIAL)
    def agree(prefix: str, text: str) -> None:
        value = prefix + text
        refused = isinstance(check.evaluate("act", {"value": value}, RUN, record=False).decision, Deny)
        assert refused is python(value, roots), f"{builtin}: {value[:120]!r} ({len(value)} characters)"

    agree()


def test_a_tool_is_hidden_from_a_run_whose_values_a_rule_cannot_hold() -> None:
    """`hides` fails closed too: a mandatory deny on the run's tenant hides the tool from a tenant
    holding a NUL, whatever its first part says."""
    check = Policy.from_text(
        "version: 1\nname: p\nmandatory: true\nrules:\n"
        "  - id: trial\n    tools: [refund]\n    when: \"run.tenant == 'trial'\"\n    decision: deny\n"
    )
    assert not check.hides("refund", RunContext(tenant="acme"))
    assert check.hides("refund", RunContext(tenant="trial"))
    assert check.hides("refund", RunContext(tenant="acme\0trial"))
