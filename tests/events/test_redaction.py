"""Redaction of tool-call arguments: key names (JSON and text), paths, detectors, oversize, failure, JSON safety."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from detect_secrets.plugins.private_key import PrivateKeyDetector
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from events.redaction import (
    DEFAULT_SECRET_KEYS,
    REDACTED,
    Detector,
    RedactedArgs,
    Redactor,
    RegexDetector,
    default_detectors,
    luhn_ok,
)

CARD = "4111 1111 1111 1111"
PLAIN = "pw"
ONE_WORD: Any = "password"
CARD_DIGITS = "4111111111111111"

# Realistic-looking fake credentials, assembled from parts so that no scanner mistakes this file for a leak.
ALNUM = "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuVwXyZ"
OPENAI_KEY = "sk-" + ALNUM + "QrStUvWxYz01"
OPENAI_PROJECT_KEY = "sk-proj-" + ALNUM + "_" + ALNUM[:20] + "-T3BlbkFJ" + ALNUM[:20]
ANTHROPIC_KEY = "sk-ant-api03-" + ALNUM + ALNUM[:30] + "-AAAA"
GITHUB_PAT = "ghp_" + ALNUM[:36]
GITHUB_OAUTH = "gho_" + ALNUM[::-1][:36]
GITHUB_SERVER = "ghs_" + ALNUM[:36]
GITHUB_FINE_GRAINED = "github_pat_11ABCDEFG0" + ALNUM + "_" + ALNUM + ALNUM[:9]
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
SLACK_BOT = "xoxb-" + "1234567890-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_USER = "xoxp-" + "1234567890-1234567890-1234567890123-" + "0123456789abcdef0123456789abcdef"
SLACK_WEBHOOK = "https://hooks.slack.com/services/" + "T00000000/B00000000/" + "XXXXXXXXXXXXXXXXXXXXXXXX"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
STRIPE_LIVE = "sk_live_" + "a1B2c3D4" * 3
STRIPE_RESTRICTED = "rk_live_" + "Z9y8X7w6" * 3
STRIPE_TEST = "sk_test_" + "a1B2c3D4" * 3
GOOGLE_KEY = "AIza" + "SyA-" + ALNUM[:31]
SENDGRID_KEY = "SG." + ALNUM[:22] + "." + ALNUM + ALNUM[:7]
GITLAB_PAT = "glpat-" + "xXyYzZ0123456789aAbB"
TWILIO_KEY = "SK" + "0123456789abcdef" * 2
TELEGRAM_TOKEN = "123456789:" + "AA" + ALNUM[:33]
DISCORD_TOKEN = "M" + ALNUM[:23] + "." + "GhIjKl" + "." + ALNUM[:27]
MAILCHIMP_KEY = "0123456789abcdef" * 2 + "-us12"
PYPI_TOKEN = "pypi-AgEIcHlwaS5vcmc" + ALNUM * 2
NPM_TOKEN = "npm_" + ALNUM[:36]
HF_TOKEN = "hf_" + ALNUM[:34].replace("0", "x")
SQUARE_SECRET = "sq0csp-" + ALNUM + ALNUM[:7]
AZURE_KEY = "AccountKey=" + (ALNUM * 3)[:86] + "=="
PEM_BODY = (
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
)
RSA_KEY = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}-----END RSA PRIVATE KEY-----"
OPENSSH_KEY = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}-----END OPENSSH PRIVATE KEY-----"

TOKENS = {
    "openai": OPENAI_KEY,
    "openai-project": OPENAI_PROJECT_KEY,
    "anthropic": ANTHROPIC_KEY,
    "github-pat": GITHUB_PAT,
    "github-oauth": GITHUB_OAUTH,
    "github-server": GITHUB_SERVER,
    "github-fine-grained": GITHUB_FINE_GRAINED,
    "aws-key-id": AWS_KEY_ID,
    "slack-bot": SLACK_BOT,
    "slack-user": SLACK_USER,
    "slack-webhook": SLACK_WEBHOOK,
    "jwt": JWT,
    "stripe-live": STRIPE_LIVE,
    "stripe-restricted": STRIPE_RESTRICTED,
    "stripe-test": STRIPE_TEST,
    "google": GOOGLE_KEY,
    "sendgrid": SENDGRID_KEY,
    "gitlab": GITLAB_PAT,
    "twilio": TWILIO_KEY,
    "telegram": TELEGRAM_TOKEN,
    "discord": DISCORD_TOKEN,
    "mailchimp": MAILCHIMP_KEY,
    "pypi": PYPI_TOKEN,
    "npm": NPM_TOKEN,
    "huggingface": HF_TOKEN,
    "square": SQUARE_SECRET,
    "azure": AZURE_KEY,
    "rsa-private-key": RSA_KEY,
    "openssh-private-key": OPENSSH_KEY,
}

CLEAN_TEXTS = [
    "",
    "hello world",
    "Please refund order A-1 for alice@example.com by 2026-11-30T08:00:00Z.",
    "call me on +1 555-123-4567 or 555 123 4567",
    "uuid 123e4567-e89b-12d3-a456-426614174000, sha256 " + "ab" * 32,
    "ask the author about the task-management skill in the repository",
    "see https://example.com/path?q=1 and C:\\Users\\bob\\file.txt",
    "order 4111 1111 1111 1112 is not a card: the Luhn check fails",
    "a 20-digit id 12345678901234567890 is one number",
]


def redactor() -> Redactor:
    """The default redactor (built once per test: construction is cheap after the first)."""
    return Redactor()


def luhn_complete(body: str) -> str:
    """`body` followed by the check digit that makes it pass the Luhn checksum."""
    for check in "0123456789":
        if luhn_ok(body + check):
            return body + check
    raise AssertionError("unreachable: one check digit always fits")


class Passthrough:
    """A detector that delegates to another one: it carries no anchors, so the redactor runs it on every string."""

    def __init__(self, inner: Detector) -> None:
        self.name = inner.name
        self._inner = inner

    def find(self, text: str) -> list[tuple[int, int]]:
        return self._inner.find(text)


class Exploding:
    """A detector that fails on every string (and quotes it in its message)."""

    name = "exploding"

    def find(self, text: str) -> list[tuple[int, int]]:
        raise RuntimeError(f"cannot scan {text!r}")


class TestLuhn:
    @pytest.mark.parametrize("number", [CARD_DIGITS, "5555555555554444", "378282246310005", "6011111111111117", "0"])
    def test_valid_numbers_pass(self, number: str) -> None:
        """Numbers with a correct Luhn check digit pass."""
        assert luhn_ok(number)

    @pytest.mark.parametrize("number", ["4111111111111112", "5555555555554445", "1"])
    def test_wrong_check_digit_fails(self, number: str) -> None:
        """A number whose last digit is off fails."""
        assert not luhn_ok(number)

    @pytest.mark.parametrize("text", ["", "4111 1111 1111 1111", "41111111111111a1", "٤١١١"])
    def test_anything_but_ascii_digits_fails(self, text: str) -> None:
        """Empty strings, separators, letters and non-ASCII digits are rejected, not raised on."""
        assert not luhn_ok(text)


class TestRegexDetector:
    def test_whole_matches_are_spans(self) -> None:
        """Without a group, every match of the pattern is one span."""
        detector = RegexDetector("ticket", r"TKT-\d+")
        assert detector.find("TKT-1 and TKT-22") == [(0, 5), (10, 16)]

    def test_group_selects_the_secret(self) -> None:
        """With a group, only the group's part of each match is a span."""
        detector = RegexDetector("pin", r"pin=(\d{4})", group=1)
        assert detector.find("user=1 pin=1234") == [(11, 15)]

    def test_named_group(self) -> None:
        """A named group works like a numbered one."""
        detector = RegexDetector("pin", r"pin=(?P<pin>\d{4})", group="pin")
        assert detector.find("pin=9876") == [(4, 8)]

    @pytest.mark.parametrize("group", [2, "nope"])
    def test_missing_group_is_refused(self, group: int | str) -> None:
        """Naming a group the pattern does not have raises ValueError at construction."""
        with pytest.raises(ValueError, match="has no group"):
            RegexDetector("pin", r"pin=(\d{4})", group=group)

    def test_is_a_detector_for_the_redactor(self) -> None:
        """A RegexDetector added as an extra detector redacts its matches."""
        result = Redactor(extra_detectors=[RegexDetector("ticket", r"TKT-\d+")]).redact_args("t", {"q": "see TKT-42"})
        assert result.args == {"q": f"see {REDACTED}"}
        assert result.redacted_paths == ("/q",)


class TestCardNumbers:
    @pytest.mark.parametrize(
        "card", [CARD, "4111-1111-1111-1111", CARD_DIGITS, "3782 822463 10005", "5555555555554444"]
    )
    def test_luhn_valid_cards_are_redacted_in_place(self, card: str) -> None:
        """A Luhn-valid card, grouped by spaces or dashes or plain, is replaced inside the string."""
        result = redactor().redact_args("pay", {"note": f"card {card} exp"})
        assert result.args == {"note": f"card {REDACTED} exp"}
        assert result.redacted_paths == ("/note",)

    def test_luhn_failing_number_is_untouched(self) -> None:
        """The same digits with a wrong check digit are left as they are."""
        result = redactor().redact_args("pay", {"note": "card 4111 1111 1111 1112 exp"})
        assert result.args == {"note": "card 4111 1111 1111 1112 exp"}
        assert result.redacted_paths == ()

    @pytest.mark.parametrize("phone", ["555-123-4567", "+1 555 123 4567", "5551234567"])
    def test_phone_numbers_are_untouched(self, phone: str) -> None:
        """A 10- or 11-digit phone number is too short to be a card."""
        assert redactor().redact_text(f"call {phone}") == f"call {phone}"

    def test_card_after_a_quantity_is_found(self) -> None:
        """A number before the card, one separator away, does not hide the card."""
        assert redactor().redact_text(f"qty 2 {CARD} exp") == f"qty 2 {REDACTED} exp"

    def test_card_glued_to_other_digits_is_one_number(self) -> None:
        """Twenty digits with no separator are one number, not a card with an extra digit."""
        assert redactor().redact_text("id 12345678901234567890") == "id 12345678901234567890"

    def test_int_leaf_with_card_digits_is_redacted(self) -> None:
        """An int whose digits form a Luhn-valid card number is replaced whole."""
        result = redactor().redact_args("pay", {"card": 4111111111111111, "amount": 12, "big": 4111111111111112})
        assert result.args == {"card": REDACTED, "amount": 12, "big": 4111111111111112}
        assert result.redacted_paths == ("/card",)

    @settings(max_examples=200, deadline=None)
    @given(
        body=st.text(alphabet="0123456789", min_size=15, max_size=15),
        separator=st.sampled_from(["", " ", "-"]),
        prefix=st.text(alphabet=st.characters(max_codepoint=127), max_size=30).filter(lambda s: not s[-1:].isdigit()),
        suffix=st.text(alphabet=st.characters(max_codepoint=127), max_size=30).filter(lambda s: not s[:1].isdigit()),
    )
    def test_any_embedded_card_disappears(self, body: str, separator: str, prefix: str, suffix: str) -> None:
        """For any Luhn-valid 16-digit number in random ASCII text, no digit glued to it, the output has none of it."""
        digits = luhn_complete(body)
        written = separator.join(digits[i : i + 4] for i in range(0, 16, 4))
        out = redactor().redact_text(prefix + written + suffix)
        assert digits not in out
        assert written not in out


class TestTokens:
    @pytest.mark.parametrize("kind", sorted(TOKENS))
    def test_token_is_replaced_inside_text(self, kind: str) -> None:
        """Each kind of key or token is replaced by REDACTED, and the text around it is kept."""
        token = TOKENS[kind]
        result = redactor().redact_args("call", {"text": f"use {token} now"})
        assert result.args == {"text": f"use {REDACTED} now"}
        assert result.redacted_paths == ("/text",)

    @pytest.mark.parametrize("kind", sorted(TOKENS))
    def test_token_alone_is_replaced_whole(self, kind: str) -> None:
        """A value that is only a token becomes exactly REDACTED."""
        assert redactor().redact_text(TOKENS[kind]) == REDACTED

    @pytest.mark.parametrize(
        "marker", [p.pattern for p in PrivateKeyDetector.denylist if p.pattern.startswith("BEGIN")]
    )
    def test_every_detect_secrets_private_key_marker_is_covered(self, marker: str) -> None:
        """Every PEM header detect-secrets knows, with its whole multi-line block, is replaced."""
        kind = marker.removeprefix("BEGIN ")
        block = f"-----{marker}-----\n{PEM_BODY}-----END {kind}-----"
        assert redactor().redact_text(f"key:\n{block}\nthanks") == f"key:\n{REDACTED}\nthanks"

    def test_private_key_without_end_is_redacted_to_the_end(self) -> None:
        """A key block cut before its END line is replaced from its header to the end of the text."""
        assert redactor().redact_text(f"key: -----BEGIN PRIVATE KEY-----\n{PEM_BODY}") == f"key: {REDACTED}"

    def test_putty_key_is_redacted(self) -> None:
        """A PuTTY key file is replaced from its header through its MAC line."""
        putty = "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPrivate-Lines: 1\nAAAAB3Nz\nPrivate-MAC: 0a1b2c3d"
        assert redactor().redact_text(f"{putty}\nbye") == f"{REDACTED}\nbye"

    def test_aws_secret_key_in_an_assignment(self) -> None:
        """A quoted AWS secret access key after an aws_secret_access_key name is replaced, the name kept."""
        text = f'aws_secret_access_key = "{AWS_SECRET}"'
        assert redactor().redact_text(text) == f'aws_secret_access_key = "{REDACTED}"'

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("Bearer abc.def", f"Bearer {REDACTED}"),
            ("curl -H 'Authorization: Bearer abc.def=='", f"curl -H 'Authorization: Bearer {REDACTED}'"),
            ("Authorization: Basic xyz", f"Authorization: Basic {REDACTED}"),
            ("authorization=s3cr3t", f"authorization={REDACTED}"),
            (
                '{"Authorization": "Token abc123", "Accept": "json"}',
                f'{{"Authorization": "Token {REDACTED}", "Accept": "json"}}',
            ),
            ("Proxy-Authorization: Digest abc\r\nHost: x", f"Proxy-Authorization: Digest {REDACTED}\r\nHost: x"),
        ],
    )
    def test_authorization_schemes_keep_the_scheme(self, text: str, expected: str) -> None:
        """In bearer and Authorization headers only the credentials are replaced, the scheme stays."""
        assert redactor().redact_text(text) == expected

    def test_credentials_in_a_url(self) -> None:
        """The password of a URL's user info is replaced; the user and host stay."""
        out = redactor().redact_text("postgres://app:hunter2@db.internal:5432/shop")
        assert out == f"postgres://app:{REDACTED}@db.internal:5432/shop"

    def test_npm_auth_token_line(self) -> None:
        """The token of an .npmrc _authToken line is replaced."""
        out = redactor().redact_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}")
        assert out == f"//registry.npmjs.org/:_authToken={REDACTED}"

    def test_longer_token_leaves_no_tail(self) -> None:
        """A token longer than detect-secrets' fixed length is replaced whole, no tail left behind."""
        long_stripe = STRIPE_LIVE + "EXTRAtail0123456789"
        assert redactor().redact_text(f"{long_stripe} x") == f"{REDACTED} x"

    def test_two_secrets_in_one_string(self) -> None:
        """Several secrets in one string are each replaced, and the path is recorded once."""
        result = redactor().redact_args("t", {"log": f"{GITHUB_PAT} then {CARD} then {JWT}."})
        assert result.args == {"log": f"{REDACTED} then {REDACTED} then {REDACTED}."}
        assert result.redacted_paths == ("/log",)

    @pytest.mark.parametrize("text", CLEAN_TEXTS)
    def test_clean_text_is_untouched(self, text: str) -> None:
        """Ordinary text, dates, phone numbers, ids and hashes are not mistaken for secrets."""
        assert redactor().redact_text(text) == text

    @pytest.mark.parametrize("text", [*CLEAN_TEXTS, *(f"x {token} y" for token in TOKENS.values()), f"a {CARD} b"])
    def test_anchors_never_hide_a_detection(self, text: str) -> None:
        """The shared gate only saves work: running every detector on every string gives the same output."""
        ungated = Redactor(detectors=[Passthrough(detector) for detector in default_detectors()])
        assert redactor().redact_text(text) == ungated.redact_text(text)

    def test_default_detectors_have_unique_names(self) -> None:
        """Every default detector has its own name, so one can be left out by name."""
        names = [detector.name for detector in default_detectors()]
        assert len(names) == len(set(names))
        assert {"card_number", "private_key", "jwt", "openai_key", "github_token"} <= set(names)

    def test_leaving_a_detector_out(self) -> None:
        """A redactor built without the jwt detector leaves JWTs alone and still finds the rest."""
        chosen = [detector for detector in default_detectors() if detector.name != "jwt"]
        out = Redactor(detectors=chosen).redact_text(f"{JWT} {GITHUB_PAT}")
        assert out == f"{JWT} {REDACTED}"


class TestSecretKeys:
    @pytest.mark.parametrize(
        "key",
        [
            "password",
            "db_password",
            "passwd",
            "api_key",
            "X-Api-Key",
            "apiKey",
            "client_secret",
            "Authorization",
            "access_token",
            "refreshToken",
            "private_key",
            "Set-Cookie",
            "session_id",
            "aws_access_key_id",
            "credentials",
            "cvv",
        ],
    )
    def test_secret_key_value_is_replaced_whole(self, key: str) -> None:
        """A value under a secret key name is replaced by REDACTED and its pointer recorded."""
        result = redactor().redact_args("t", {key: "plain value", "other": "kept"})
        assert result.args == {key: REDACTED, "other": "kept"}
        assert result.redacted_paths == (f"/{key}",)

    @pytest.mark.parametrize("value", [{"a": 1, "b": ["x"]}, ["x", "y"], 1234, None, 1.5, True])
    def test_any_type_under_a_secret_key_is_one_marker(self, value: Any) -> None:
        """A dict, list, number, None or bool under a secret key becomes the single string REDACTED."""
        result = redactor().redact_args("t", {"password": value})
        assert result.args == {"password": REDACTED}
        assert result.redacted_paths == ("/password",)

    @pytest.mark.parametrize("key", ["author", "subject", "body", "to", "shipping", "business_name", "cwd"])
    def test_ordinary_keys_are_not_secret(self, key: str) -> None:
        """Keys that merely resemble secret words keep their values."""
        assert redactor().redact_args("t", {key: "value"}).args == {key: "value"}

    def test_custom_keys_replace_the_defaults(self) -> None:
        """Given secret_keys, only those words mark keys (case and '-'/'_' ignored)."""
        custom = Redactor(detectors=[], secret_keys=["ssn"])
        result = custom.redact_args("t", {"Customer-SSN": "123-45-6789", "password": "kept"})
        assert result.args == {"Customer-SSN": REDACTED, "password": "kept"}

    def test_no_keys(self) -> None:
        """An empty secret_keys list turns key matching off."""
        assert Redactor(secret_keys=[]).redact_args("t", {"password": "x"}).args == {"password": "x"}

    def test_defaults_are_documented_words(self) -> None:
        """The default key words are lower-case and hold neither '-' nor '_', as matching expects."""
        assert all(word == word.lower() and "-" not in word and "_" not in word for word in DEFAULT_SECRET_KEYS)

    def test_empty_key_word_is_refused(self) -> None:
        """A key word that is empty once '-' and '_' are removed would match every key: ValueError."""
        with pytest.raises(ValueError, match="match every key"):
            Redactor(secret_keys=["_-"])

    def test_single_string_is_refused(self) -> None:
        """secret_keys given as one string (a sequence of letters) raises TypeError."""
        with pytest.raises(TypeError, match="not one string"):
            Redactor(secret_keys=ONE_WORD)


HK_LIVE = "hk_live_" + ALNUM[:24]
# Not a key format any content detector knows: only the key name before it can give it away.

LEAKED_RECORDS = [
    # (free text as a tool received it, the secret in it): the twenty shapes measured leaking from outside.
    ('Hi team,\nthe staging login is password="hunter2hunter2" until Friday.\nThanks, Bob', "hunter2hunter2"),
    ("mysql -u app --password=hunter2hunter2-01 shop < dump.sql", "hunter2hunter2-01"),
    (f'curl -s -H "X-Api-Key: {HK_LIVE}1" https://api.example.com/v1/orders', f"{HK_LIVE}1"),
    (f"GET https://api.example.com/v1/orders?api_key={HK_LIVE}2&page=2 returned 200", f"{HK_LIVE}2"),
    ('{"user": "bob", "password": "hunter2hunter2-05", "remember": true}', "hunter2hunter2-05"),
    ("db:\n  host: db.internal\n  password: hunter2hunter2-06\n  pool: 5\n", "hunter2hunter2-06"),
    (f"export API_KEY={HK_LIVE}7 && ./deploy.sh --prod", f"{HK_LIVE}7"),
    (f"DEBUG=1\nSECRET_KEY={HK_LIVE}8\nALLOWED_HOSTS=*\n", f"{HK_LIVE}8"),
    (f"client = Client(api_key='{HK_LIVE}9', timeout=5)", f"{HK_LIVE}9"),
    ("login failed for bob (password=hunter2hunter2-10) from 10.0.0.7", "hunter2hunter2-10"),
    (f"[auth]\nuser = deploy\ntoken = {HK_LIVE}11\n", f"{HK_LIVE}11"),
    (f'{{\\"access_token\\": \\"{HK_LIVE}12\\", \\"expires_in\\": 3600}}', f"{HK_LIVE}12"),
    ("Server=db;Database=shop;User Id=app;Password=hunter2hunter2-13;Encrypt=true", "hunter2hunter2-13"),
    (f"Credentials for the sandbox: `api_key={HK_LIVE}14` (rotate monthly)", f"{HK_LIVE}14"),
    ("UPDATE users SET password = 'hunter2 hunter2 15' WHERE id = 4", "hunter2 hunter2 15"),
    (f"Post updates to https://hooks.example.com/in?channel=ops&token={HK_LIVE}16 please.", f"{HK_LIVE}16"),
    (f'{{"API-KEY" : "{HK_LIVE}17"}}', f"{HK_LIVE}17"),
    (f"Set-Cookie: session_id={HK_LIVE}18; Path=/; HttpOnly", f"{HK_LIVE}18"),
    ("ssh deploy@host 'PGPASSWORD=hunter2hunter2-19 psql -h db shop'", "hunter2hunter2-19"),
    (f"Reminder: apiKey: {HK_LIVE}20, clientSecret: hunter2hunter2-20", f"{HK_LIVE}20"),
]


class TestSecretKeysInText:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("password=hunter2hunter2", f"password={REDACTED}"),
            ("password: hunter2hunter2", f"password: {REDACTED}"),
            ('password = "hunter2 hunter2"', f'password = "{REDACTED}"'),
            ("password='hunter2 hunter2'", f"password='{REDACTED}'"),
            ('{"password": "hunter2", "user": "bob"}', f'{{"password": "{REDACTED}", "user": "bob"}}'),
            ("{'api_key': 'hk', 'n': 1}", f"{{'api_key': '{REDACTED}', 'n': 1}}"),
            ('{\\"password\\": \\"hunter2\\"}', f'{{\\"password\\": \\"{REDACTED}\\"}}'),
            ("mysql --password=hunter2 shop", f"mysql --password={REDACTED} shop"),
            ("https://x.example/a?token=abc123&page=2", f"https://x.example/a?token={REDACTED}&page=2"),
            ("password := hunter2", f"password := {REDACTED}"),
            ("'password' => 'hunter2'", f"'password' => '{REDACTED}'"),
            ("token:\thunter2", f"token:\t{REDACTED}"),
        ],
    )
    def test_each_form_keeps_the_key_and_loses_the_value(self, text: str, expected: str) -> None:
        """key=value, key: value, quoted values, embedded JSON and query strings keep the key name only."""
        assert redactor().redact_text(text) == expected

    def test_the_string_pointer_is_reported(self) -> None:
        """In the arguments the value is replaced inside its string, and that string's pointer is recorded."""
        args = {"to": "a@b.example", "body": 'login with password="hunter2hunter2" today', "n": 1}
        result = redactor().redact_args("send_email", args)
        assert result.args == {"to": "a@b.example", "body": f'login with password="{REDACTED}" today', "n": 1}
        assert result.redacted_paths == ("/body",)

    def test_nested_strings_are_reported_by_their_own_pointer(self) -> None:
        """A string deep in lists and dicts is reported by its full pointer, once however many values it loses."""
        args = {"messages": [{"text": "hi"}, {"text": f"api_key={HK_LIVE} token: abc"}], "cmd": ["sh", "-c", "x=1"]}
        result = redactor().redact_args("t", args)
        assert result.args == {
            "messages": [{"text": "hi"}, {"text": f"api_key={REDACTED} token: {REDACTED}"}],
            "cmd": ["sh", "-c", "x=1"],
        }
        assert result.redacted_paths == ("/messages/1/text",)

    def test_text_and_arguments_agree(self) -> None:
        """redact_text (messages, reasons, errors) redacts a string exactly as redact_args redacts it as an argument."""
        for text, _secret in LEAKED_RECORDS:
            result = redactor().redact_args("t", {"text": text})
            assert result.args == {"text": redactor().redact_text(text)}

    @pytest.mark.parametrize(
        "key",
        [
            "PASSWORD",
            "Password",
            "db_password",
            "db.password",
            "API-Key",
            "apiKey",
            "x-api-key",
            "X_API_KEY",
            "access_token",
            "refreshToken",
            "aws_access_key_id",
            "client-Secret",
            "private_key",
            "SESSION_ID",
            "pass_word",
        ],
    )
    def test_key_names_are_normalised_as_json_keys_are(self, key: str) -> None:
        """Case and '-'/'_' are ignored and the key word may sit anywhere in the name, as for JSON keys."""
        assert redactor().redact_args("t", {key: "v"}).args == {key: REDACTED}
        assert redactor().redact_text(f"{key}=v1 {key}: v2") == f"{key}={REDACTED} {key}: {REDACTED}"

    @pytest.mark.parametrize(
        "text",
        [
            "user=alice page=2 limit: 50",
            "Note: the author: Bob, subject: quarterly report",
            "cwd=/tmp pwd=/home/bob shipping: 2 days",
            "meet at 10:30, ratio 3:1, see https://example.com/a?q=1&sort=asc",
            "passwords are rotated every 90 days",
            "the password policy requires: 12 characters",
            "send the api key by phone; the token arrives tomorrow",
            "keys: password, token and secret are redacted",
            "password=",
            'password = "" and token: ',
        ],
    )
    def test_other_keys_and_prose_are_left_alone(self, text: str) -> None:
        """Keys without a key word, key words not right before a separator, and empty values change nothing."""
        assert redactor().redact_text(text) == text
        assert redactor().redact_args("t", {"body": text}) == RedactedArgs({"body": text}, (), False, None)

    def test_a_key_word_before_a_colon_loses_the_next_word_even_in_prose(self) -> None:
        """Safety over prose: 'Password: must be ...' is read as a key and a value, like 'Password: hunter2'."""
        assert redactor().redact_text("Password: must be 12 characters") == f"Password: {REDACTED} be 12 characters"

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("token=abc&x=1", f"token={REDACTED}&x=1"),
            ("token=abc;x=1", f"token={REDACTED};x=1"),
            ("token=abc,x=1", f"token={REDACTED},x=1"),
            ("token=abc x=1", f"token={REDACTED} x=1"),
            ("token=abc\nx=1", f"token={REDACTED}\nx=1"),
            ("token=a'b\"c=d", f"token={REDACTED}"),
            ("curl 'https://x.example/?token=abc'", f"curl 'https://x.example/?token={REDACTED}'"),
            ('secret="a, b; c & d" x', f'secret="{REDACTED}" x'),
            ('secret="a \\" b" x', f'secret="{REDACTED}" x'),
            ('secret="never closed\nnext line', f'secret="{REDACTED}\nnext line'),
            ("secret='a b' c", f"secret='{REDACTED}' c"),
        ],
    )
    def test_where_a_value_ends(self, text: str, expected: str) -> None:
        """Unquoted values end at whitespace, '&', ';', ',' or a closing quote; quoted ones at their closing quote."""
        assert redactor().redact_text(text) == expected

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("token: Bearer abc.def", f"token: Bearer {REDACTED}"),
            ('{"Authorization": "Basic dXNlcjpwdw=="}', f'{{"Authorization": "Basic {REDACTED}"}}'),
            ("password: bearer", f"password: {REDACTED}"),
        ],
    )
    def test_an_authorization_scheme_stays_visible(self, text: str, expected: str) -> None:
        """A scheme word before the value is kept, as for Authorization headers; alone, it is the value."""
        assert redactor().redact_text(text) == expected

    def test_the_configured_key_words_apply(self) -> None:
        """secret_keys decides the key names in text too; [] and Redactor.none() turn the rule off."""
        custom = Redactor(detectors=[], secret_keys=["ssn"])
        assert custom.redact_text("Customer-SSN: 123-45-6789, password: kept") == (
            f"Customer-SSN: {REDACTED}, password: kept"
        )
        assert Redactor(secret_keys=[]).redact_text("password=x") == "password=x"
        assert Redactor.none().redact_args("t", {"q": "password=x"}).args == {"q": "password=x"}
        assert Redactor(detectors=[]).redact_args("t", {"q": "password=x"}).args == {"q": f"password={REDACTED}"}

    def test_combines_with_the_detectors(self) -> None:
        """Values after key names and detector matches in one string are all replaced, the rest kept."""
        text = f"password=hunter2 card {CARD} token: {GITHUB_PAT} ok"
        assert redactor().redact_text(text) == f"password={REDACTED} card {REDACTED} token: {REDACTED} ok"

    def test_error_texts_are_covered(self) -> None:
        """A failing detector's message quoting the arguments is cleaned of values after key names too."""
        result = Redactor(extra_detectors=[Exploding()]).redact_args("t", {"q": "password=hunter2hunter2"})
        assert result.args is None
        assert result.error == f"RuntimeError: cannot scan 'password={REDACTED}'"

    def test_a_quoted_value_inside_another_value_is_replaced_whole(self) -> None:
        """A key inside a value already found still has its own quoted value replaced to its closing quote."""
        assert redactor().redact_text('password=a:token="b c d" e') == f'password={REDACTED}" e'

    def test_cost_is_linear_in_nested_keys(self) -> None:
        """A long run of "token=token=..." is one value, found in one pass (a rescan per key would take minutes)."""
        assert redactor().redact_text("token=" * 100_000) == f"token={REDACTED}"
        assert redactor().redact_text('password="' + "token:" * 100_000) == f'password="{REDACTED}'

    def test_many_distinct_key_names_do_not_change_results(self) -> None:
        """Past the memo's size, key names are still judged, just no longer remembered."""
        shared = redactor()
        for index in range(5000):
            shared.redact_text(f"k{index}=v")
        assert shared.redact_text("key9999=v password=x") == f"key9999=v password={REDACTED}"

    def test_twenty_free_text_records_leak_nothing(self) -> None:
        """The twenty records measured leaking verbatim from outside: no secret is left, every body is reported."""
        leaked = []
        for text, secret in LEAKED_RECORDS:
            result = redactor().redact_args("send_email", {"to": "a@b.example", "subject": "hi", "body": text})
            if secret in json.dumps(result.args) or result.redacted_paths != ("/body",):
                leaked.append(text)
        assert len(LEAKED_RECORDS) == 20
        assert len({secret for _text, secret in LEAKED_RECORDS}) == 20
        assert leaked == []

    @settings(max_examples=300, deadline=None)
    @given(
        key=st.sampled_from(["password", "api_key", "X-Api-Key", "accessToken", "client_secret", "Cookie"]),
        form=st.sampled_from(["{k}={v}", "{k}: {v}", '{k} = "{v}"', '"{k}": "{v}"', "{k}='{v}'", "?{k}={v}&a=1"]),
        value=st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=6, max_size=24),
        prefix=st.text(alphabet=st.characters(max_codepoint=127), max_size=30),
        suffix=st.text(alphabet=st.characters(max_codepoint=127), max_size=30),
    )
    def test_any_value_after_a_secret_key_disappears(
        self, key: str, form: str, value: str, prefix: str, suffix: str
    ) -> None:
        """Whatever ASCII text surrounds it, a value written after a secret key name is not in the output."""
        secret = "Zq" + value
        assume(secret not in prefix and secret not in suffix)
        assert secret not in redactor().redact_text(prefix + form.format(k=key, v=secret) + suffix)


class TestPaths:
    def test_nested_pointers_and_escaping(self) -> None:
        """Pointers walk dicts and lists, and escape '~' as '~0' and '/' as '~1'."""
        args = {
            "items": [{"sku": "a"}, {"token": "t-1", "note": f"card {CARD}"}],
            "headers": {"Authorization": "Bearer x", "a/b": {"m~n": GITHUB_PAT}},
        }
        result = redactor().redact_args("t", args)
        assert result.redacted_paths == (
            "/items/1/token",
            "/items/1/note",
            "/headers/Authorization",
            "/headers/a~1b/m~0n",
        )
        assert result.args == {
            "items": [{"sku": "a"}, {"token": REDACTED, "note": f"card {REDACTED}"}],
            "headers": {"Authorization": REDACTED, "a/b": {"m~n": REDACTED}},
        }

    def test_tool_paths_apply_to_their_tool_only(self) -> None:
        """A path configured for one tool is replaced there and nowhere else."""
        configured = Redactor(paths={"send_email": ["/body"]})
        assert configured.redact_args("send_email", {"body": "hi", "to": "a"}).args == {"body": REDACTED, "to": "a"}
        assert configured.redact_args("other", {"body": "hi"}).args == {"body": "hi"}

    def test_star_paths_apply_to_every_tool(self) -> None:
        """Paths under '*' are replaced for every tool, alongside the tool's own paths."""
        configured = Redactor(paths={"*": ["/ssn"], "send_email": ["/body"]})
        assert configured.redact_args("send_email", {"body": "hi", "ssn": "1"}).args == {
            "body": REDACTED,
            "ssn": REDACTED,
        }
        assert configured.redact_args("anything", {"body": "hi", "ssn": "1"}).args == {"body": "hi", "ssn": REDACTED}

    def test_path_to_a_container_replaces_it_whole(self) -> None:
        """A path naming a dict or list replaces the whole container by one marker."""
        configured = Redactor(paths={"t": ["/profile", "/list/1"]})
        result = configured.redact_args("t", {"profile": {"name": "a"}, "list": [1, [2, 3], 4]})
        assert result.args == {"profile": REDACTED, "list": [1, REDACTED, 4]}
        assert result.redacted_paths == ("/profile", "/list/1")

    def test_escaped_path(self) -> None:
        """A configured pointer with RFC 6901 escapes names the key that holds '/' or '~'."""
        configured = Redactor(detectors=[], paths={"t": ["/a~1b/c~0d"]})
        assert configured.redact_args("t", {"a/b": {"c~d": 1, "e": 2}}).args == {"a/b": {"c~d": REDACTED, "e": 2}}

    def test_absent_path_changes_nothing(self) -> None:
        """A configured pointer that the arguments do not have is ignored."""
        assert Redactor(paths={"t": ["/missing/0"]}).redact_args("t", {"x": [1]}).args == {"x": [1]}

    @pytest.mark.parametrize("pointer", ["body", "/a~2b", ""])
    def test_malformed_pointer_is_refused(self, pointer: str) -> None:
        """A pointer not starting with '/' or with a bad '~' escape raises ValueError at construction."""
        with pytest.raises(ValueError, match="paths"):
            Redactor(paths={"t": [pointer]})

    def test_single_string_is_refused(self) -> None:
        """A tool's paths given as one string raise TypeError."""
        with pytest.raises(TypeError, match="not one string"):
            Redactor(paths={"t": "/body"})


class TestDetectorChoice:
    def test_no_detectors_leaves_content_but_keys_still_apply(self) -> None:
        """detectors=[] turns content scanning off; secret keys still apply."""
        result = Redactor(detectors=[]).redact_args("t", {"note": f"card {CARD}", "password": "p"})
        assert result.args == {"note": f"card {CARD}", "password": REDACTED}

    def test_extra_detectors_add_to_the_defaults(self) -> None:
        """An extra detector finds its own secrets and the defaults keep working."""
        configured = Redactor(extra_detectors=[RegexDetector("employee", r"EMP-\d{6}")])
        assert configured.redact_text(f"EMP-123456 {CARD}") == f"{REDACTED} {REDACTED}"

    def test_several_regex_detectors_each_fire(self) -> None:
        """Plain regex detectors sharing one prefilter each still find their matches, with their own flags."""
        configured = Redactor(
            detectors=[
                RegexDetector("employee", r"emp-\d{3}"),
                RegexDetector("case", re.compile(r"case-(\d+)", re.IGNORECASE), group=1),
                RegexDetector("line", re.compile(r"^tail$", re.MULTILINE)),
            ]
        )
        assert configured.redact_text("emp-123 CASE-9\ntail") == f"{REDACTED} CASE-{REDACTED}\n{REDACTED}"
        assert configured.redact_text("Emp-123 case-x tails") == "Emp-123 case-x tails"

    def test_verbose_patterns_keep_their_meaning(self) -> None:
        """A VERBOSE pattern merged with another still ignores its own whitespace and comments."""
        configured = Redactor(
            detectors=[RegexDetector("a", re.compile(r"ab c  # comment", re.VERBOSE)), RegexDetector("b", "zz")]
        )
        assert configured.redact_text("abc zz") == f"{REDACTED} {REDACTED}"

    def test_any_object_with_name_and_find_is_a_detector(self) -> None:
        """A plain object with `name` and `find` is used as a detector; its spans are merged."""

        class Vowels:
            name = "vowels"

            def find(self, text: str) -> list[tuple[int, int]]:
                return [(i, i + 1) for i, char in enumerate(text) if char in "ae"] + [(-5, 1), (9, 99)]

        assert Redactor(detectors=[Vowels()]).redact_text("abcde") == f"{REDACTED}bcd{REDACTED}"

    def test_object_without_find_is_refused(self) -> None:
        """Something without a find method is not a detector: TypeError at construction."""
        with pytest.raises(TypeError, match="find"):
            Redactor(detectors=["not a detector"])  # type: ignore[list-item]

    def test_none_redacts_nothing(self) -> None:
        """Redactor.none() has no detectors, no keys and no paths."""
        args = {"password": "p", "note": f"card {CARD}"}
        assert Redactor.none().redact_args("t", args) == RedactedArgs(dict(args), (), False, None)


class TestDisabled:
    def test_args_pass_through_as_a_json_safe_copy(self) -> None:
        """Disabled, nothing is redacted, but the copy is still JSON-safe and never cut."""
        disabled = Redactor(enabled=False, max_chars=10)
        args = {"password": "p", "when": date(2026, 1, 2), "items": ("a", CARD)}
        result = disabled.redact_args("t", args)
        assert result == RedactedArgs({"password": "p", "when": "2026-01-02", "items": ["a", CARD]}, (), False, None)

    def test_text_passes_through(self) -> None:
        """Disabled, redact_text returns its input."""
        assert Redactor(enabled=False).redact_text(CARD) == CARD


class TestOversize:
    def test_oversized_args_are_cut_after_redaction(self) -> None:
        """Args longer than max_chars as JSON are cut, and the cut text holds only redacted values."""
        configured = Redactor(max_chars=60)
        args = {"password": "hunter2-" * 10, "note": f"card {CARD} " + "x" * 200}
        result = configured.redact_args("t", args)
        assert result.truncated
        assert result.redacted_paths == ("/password", "/note")
        assert result.args is not None
        cut = result.args["_truncated"]
        expected = json.dumps({"password": REDACTED, "note": f"card {REDACTED} " + "x" * 200})[:60]
        assert cut == expected
        assert "hunter2" not in cut
        assert CARD not in cut

    def test_args_at_the_limit_are_kept(self) -> None:
        """Args whose JSON text is exactly max_chars long are returned whole."""
        args = {"note": "x" * 20}
        limit = len(json.dumps(args))
        assert Redactor(max_chars=limit).redact_args("t", args) == RedactedArgs(args, (), False, None)
        assert Redactor(max_chars=limit - 1).redact_args("t", args).truncated

    def test_many_small_values_count(self) -> None:
        """A long list of numbers is measured too, not only strings."""
        result = Redactor(max_chars=100).redact_args("t", {"n": list(range(1000))})
        assert result.truncated
        assert result.args == {"_truncated": json.dumps({"n": list(range(1000))})[:100]}

    def test_none_redactor_still_cuts(self) -> None:
        """Redactor.none() is enabled, so oversized args are still cut."""
        result = Redactor.none().redact_args("t", {"blob": "y" * 20_000})
        assert result.truncated
        assert result.args is not None
        assert len(result.args["_truncated"]) == 16_384

    @pytest.mark.parametrize("max_chars", [0, -1, True])
    def test_bad_limit_is_refused(self, max_chars: int) -> None:
        """max_chars must be a positive int."""
        with pytest.raises(ValueError, match="max_chars"):
            Redactor(max_chars=max_chars)


class TestFailure:
    def test_failing_detector_drops_the_args(self) -> None:
        """When a detector raises, args are None and error names the exception; redact_args does not raise."""
        result = Redactor(extra_detectors=[Exploding()]).redact_args("t", {"note": "hello"})
        assert result.args is None
        assert result.redacted_paths == ()
        assert not result.truncated
        assert result.error == "RuntimeError: cannot scan 'hello'"

    def test_error_text_is_redacted(self) -> None:
        """A secret quoted in the exception message does not reach the error field."""
        result = Redactor(extra_detectors=[Exploding()]).redact_args("t", {"note": GITHUB_PAT})
        assert result.error is not None
        assert GITHUB_PAT not in result.error
        assert REDACTED in result.error

    def test_cycle_drops_the_args(self) -> None:
        """Self-referencing arguments fail closed instead of recursing forever."""
        looped: dict[str, Any] = {"a": 1}
        looped["self"] = looped
        result = redactor().redact_args("t", looped)
        assert result.args is None
        assert result.error is not None
        assert result.error.startswith("RecursionError: ")

    def test_non_mapping_args_fail_closed(self) -> None:
        """Arguments that are not a mapping give an error result rather than an exception."""
        result = redactor().redact_args("t", ["a", "b"])  # type: ignore[arg-type]
        assert result.args is None
        assert result.error == "TypeError: args must be a mapping, got list"

    def test_failing_detector_in_text_gives_the_marker(self) -> None:
        """redact_text with a failing detector returns REDACTED, never the raw text."""
        assert Redactor(extra_detectors=[Exploding()]).redact_text("hello") == REDACTED


class Color(enum.Enum):
    RED = "red"


class Account(BaseModel):
    name: str
    password: str
    opened: datetime


@dataclasses.dataclass
class Point:
    x: int
    label: str


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no")


class TestJsonSafeCopy:
    def test_non_json_values_are_converted(self) -> None:
        """datetimes, bytes, Decimals, sets, tuples, enums, models and dataclasses become JSON values."""
        args: dict[Any, Any] = {
            "when": datetime(2026, 11, 30, 8, 0, tzinfo=UTC),
            "blob": b"\x00\x01\x02",
            "amount": Decimal("12.50"),
            "tags": {"b", "a"},
            "pair": (1, "x"),
            "color": Color.RED,
            "account": Account(name="bob", password=PLAIN, opened=datetime(2026, 1, 1, tzinfo=UTC)),
            "point": Point(1, "p"),
            "nan": float("nan"),
            "odd": Unprintable(),
            1: "int key",
            None: "none key",
        }
        result = redactor().redact_args("t", args)
        assert result.args == {
            "when": "2026-11-30T08:00:00+00:00",
            "blob": "<3 bytes>",
            "amount": "12.50",
            "tags": ["a", "b"],
            "pair": [1, "x"],
            "color": "red",
            "account": {"name": "bob", "password": REDACTED, "opened": "2026-01-01T00:00:00Z"},
            "point": {"x": 1, "label": "p"},
            "nan": "NaN",
            "odd": "<Unprintable>",
            "1": "int key",
            "null": "none key",
        }
        assert result.redacted_paths == ("/account/password",)
        json.dumps(result.args, allow_nan=False)

    def test_converted_values_are_scanned(self) -> None:
        """A secret inside a converted value (a Decimal's text, a model field) is still found."""
        result = redactor().redact_args("t", {"n": Decimal(CARD_DIGITS), "p": Point(1, GITHUB_PAT)})
        assert result.args == {"n": REDACTED, "p": {"x": 1, "label": REDACTED}}
        assert result.redacted_paths == ("/n", "/p/label")

    def test_input_is_never_mutated(self) -> None:
        """The arguments are the same before and after, and the copy shares no container with them."""
        args: dict[str, Any] = {"password": "p", "items": [{"token": "t", "x": [CARD]}], "meta": {"k": "v"}}
        before = copy.deepcopy(args)
        result = redactor().redact_args("t", args)
        assert args == before
        assert result.args is not None
        assert result.args["items"] is not args["items"]
        assert result.args["meta"] is not args["meta"]

    def test_copy_of_clean_args_is_equal(self) -> None:
        """Clean arguments come back equal, with nothing recorded."""
        args = {"to": "a@b.example", "subject": "quarterly report", "priority": 2, "flags": [True, None, 1.5]}
        assert redactor().redact_args("send_email", args) == RedactedArgs(args, (), False, None)


class TestRedactText:
    def test_detectors_and_secret_keys(self) -> None:
        """redact_text replaces detector matches and the values after secret key names."""
        assert redactor().redact_text(f"password: hunter2, card {CARD}") == f"password: {REDACTED}, card {REDACTED}"

    def test_multi_line_error_message(self) -> None:
        """A traceback-like message with a token and a key block is cleaned line by line."""
        message = f"HTTP 401 for token {SLACK_BOT}\n{RSA_KEY}\nretry later"
        assert redactor().redact_text(message) == f"HTTP 401 for token {REDACTED}\n{REDACTED}\nretry later"


class TestConcurrency:
    def test_shared_redactor_gives_the_same_results_from_many_threads(self) -> None:
        """One Redactor used from eight threads at once gives each call the result a lone call gives."""
        shared = redactor()
        calls = [("t", {f"key{i}": f"v{i} {CARD}", "password": i, "n": i}) for i in range(400)]
        expected = [shared.redact_args(tool, args) for tool, args in calls]
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda call: shared.redact_args(*call), calls))
        assert results == expected


class TestImports:
    def test_module_loads_no_transport(self) -> None:
        """Importing events.redaction and building a Redactor loads neither opentelemetry, aiokafka nor duckdb."""
        code = (
            "import sys, events.redaction as r; r.Redactor();"
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'aiokafka', 'duckdb')))"
        )
        loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert loaded.strip() == ""
