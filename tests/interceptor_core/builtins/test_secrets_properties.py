"""Properties of `has_secrets` over adversarial strings: it never raises, and no invisible
character, encoding chain or split hides a known secret."""

from __future__ import annotations

import base64
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor_core import tool
from interceptor_core.builtins import NoSecrets, has_secrets
from interceptor_core.decisions import Deny
from interceptor_core.testing import make_call

SECRETS = (
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IifQ.c2lnbmF0dXJlX29mX3RoZV90b2tlbg",
    "4111 1111 1111 1111",
    "xoxb-123456789012-1234567890123-aBcDeFgHiJkLmNoPqRsTuVwX",
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
)
"""Known secrets, each found by the redactor's detectors when written plainly."""

INVISIBLE = st.characters(categories=["Cf", "Mn", "Me", "Co"]) | st.characters(
    categories=["Cc"], exclude_characters="\t\n\r"
)
"""Characters a reader does not see (format, combining, private-use, control): never a separator."""

ADVERSARIAL = st.lists(
    st.characters(codec=None, categories=None)  # every code point, surrogates included
    | st.sampled_from("\x00\u200b\u200d\u2060\ufeff\u202e\u00ad\u0410\u041a\u039f\uff21\U0001d400\u0664%=:&\\")
    | st.sampled_from(["AKIA", "eyJ", "4111", "%41", "&#65;", "\\x41", "pwd=", "QUtJQ", "sk-", "ghp_"]),
    max_size=80,
).map("".join)
"""Strings made of any code point, favouring the characters and pieces the normalization and the
decoders act on."""

LONG = st.builds(lambda piece, times: piece * times, ADVERSARIAL, st.integers(min_value=100, max_value=1000))

VALUES = st.recursive(
    ADVERSARIAL | LONG | st.integers() | st.floats() | st.binary(max_size=100) | st.none() | st.booleans(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ADVERSARIAL, inner, max_size=4),
    max_leaves=12,
)


class TestNeverRaises:
    @settings(max_examples=300, deadline=None)
    @given(VALUES)
    def test_any_value_gets_a_verdict(self, value: Any) -> None:
        """Any string (NUL, controls, format characters, surrogates, confusables, long), number,
        bytes or nesting of them gets True or False, never an exception."""
        assert has_secrets(value) in (True, False)

    @settings(max_examples=100, deadline=None)
    @given(ADVERSARIAL)
    def test_a_string_holding_nul_or_a_surrogate_is_refused(self, text: str) -> None:
        """Such a string cannot be held whole by the policy engine: both routes refuse it."""
        if "\x00" in text or any("\ud800" <= char <= "\udfff" for char in text):
            assert has_secrets(text)
            assert has_secrets({"value": ["ok", text]})


def _insert(secret: str, draw: st.DrawFn) -> str:
    characters = list(secret)
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=len(characters)))
        characters.insert(at, draw(INVISIBLE))
    return "".join(characters)


@st.composite
def hidden_secrets(draw: st.DrawFn) -> str:
    """A known secret with invisible characters inserted, inside prose."""
    secret = _insert(draw(st.sampled_from(SECRETS)), draw)
    return f"{draw(st.sampled_from(['', 'use ', 'the key: ']))}{secret}{draw(st.sampled_from(['', ' thanks', '.']))}"


ENCODERS: dict[str, Callable[[str], str]] = {
    "base64": lambda text: base64.b64encode(text.encode("utf-8", "surrogatepass")).decode(),
    "urlsafe": lambda text: base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode().rstrip("="),
    "hex": lambda text: text.encode("utf-8", "surrogatepass").hex(),
    "percent": lambda text: "".join(f"%{byte:02X}" for byte in text.encode("utf-8", "surrogatepass")),
    "url-quote": lambda text: urllib.parse.quote(text, safe=""),
}


class TestHidingFails:
    @settings(max_examples=300, deadline=None)
    @given(hidden_secrets())
    def test_invisible_characters_inside_a_secret_never_hide_it(self, text: str) -> None:
        """Zero-width, format, combining, private-use and control characters anywhere in a key,
        token, JWT or card number leave it found."""
        assert has_secrets(text)
        assert has_secrets({"note": text})

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(SECRETS), st.lists(st.sampled_from(sorted(ENCODERS)), min_size=1, max_size=3))
    def test_up_to_three_layers_of_encoding_never_hide_a_secret(self, secret: str, chain: list[str]) -> None:
        """Base64 (both alphabets), hex and percent-encoding, in any order up to three deep."""
        text = secret
        for name in chain:
            text = ENCODERS[name](text)
        assert has_secrets(text), chain
        assert has_secrets(f"payload={text}&page=2"), chain

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(SECRETS), st.data())
    def test_a_secret_split_across_list_items_or_fields_is_found(self, secret: str, data: st.DataObject) -> None:
        """Cut at any places into list items, or at one place into two fields in either order."""
        cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=len(secret) - 1), min_size=1, max_size=3)))
        pieces = [secret[start:end] for start, end in zip([0, *cuts], [*cuts, len(secret)], strict=True)]
        if secret[0].isdigit():
            return  # digits glued across values are not taken for a card (see has_secrets)
        assert has_secrets(pieces)
        first, second = secret[: cuts[0]], secret[cuts[0] :]
        assert has_secrets({"value": first, "other": second})
        assert has_secrets({"value": second, "other": first})


@tool
def act(value: Any = None, other: Any = None, third: Any = None) -> str:
    """Acts on its arguments."""
    return "done"


class TestRoutesAgree:
    @settings(max_examples=200, deadline=None)
    @given(
        st.dictionaries(
            st.sampled_from(["value", "other", "third"]),
            ADVERSARIAL | st.sampled_from([*SECRETS, "AKIAIOSF", "ODNN7EXAMPLE", "hello"]) | st.lists(ADVERSARIAL),
            min_size=1,
        )
    )
    def test_no_secrets_denies_exactly_what_has_secrets_refuses(self, args: dict[str, Any]) -> None:
        """NoSecrets over all arguments (field by field, then joined) and has_secrets on the whole
        arguments give the same verdict."""
        decision = NoSecrets().before_tool_call(make_call(act, args))
        assert isinstance(decision, Deny) == has_secrets(args)


def test_the_recursion_limit_is_not_reached_by_nested_encodings() -> None:
    """Encoding a secret ten times over costs a bounded number of layers, without raising."""
    text = "AKIAIOSFODNN7EXAMPLE"
    for _ in range(10):
        text = base64.b64encode(text.encode()).decode()
    assert has_secrets(text) in (True, False)
    assert sys.getrecursionlimit() > 10
