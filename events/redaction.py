"""Redaction of tool-call arguments before any audit event leaves the process.

`Redactor.redact_args` turns a tool call's arguments into a JSON-safe copy in which every secret is
replaced by `REDACTED`, with the RFC 6901 JSON pointer of each replaced value. Four rules find secrets:

* key names: a value whose key contains one of the secret key words (`DEFAULT_SECRET_KEYS`, compared
  case-insensitively after removing "-" and "_") is replaced whole, whatever its type;
* key names in text: inside every string, a value written after such a key name and ":" or "="
  ('password="hunter2"', "api_key: ...", '{"token": "..."}', "?token=...&x=1") is replaced in
  place, the key name kept ('password="[REDACTED]"');
* paths: JSON pointers configured per tool name ("*" for every tool) are replaced whole;
* content detectors: every string leaf is scanned, and each matched span is replaced in place
  ("card 4111 1111 1111 1111 exp" becomes "card [REDACTED] exp").

It runs on the hot path of every tool call, so everything is compiled at construction. The default
detectors share one gate pattern made of short anchors, each starting with a character that is rare
in ordinary text ("-" of "sk-", "_" of "ghp_", "J" of "eyJ", ...); `re` compiles it to a scan over a
character set, so a clean string costs one C call, and a detector's own pattern runs only on strings
in which its anchor occurs. Card numbers have no such character: a string needs 13 digits before the
card detector runs. Key names in text are looked for only in strings holding ":" or "=", and only
just before those characters. Redaction fails closed: `redact_args` never raises, and when anything
goes wrong it drops the arguments rather than let them through.

This module imports no transport (no opentelemetry, aiokafka or duckdb); detect-secrets is imported
when the default detectors are first built.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pydantic import BaseModel

__all__ = [
    "DEFAULT_SECRET_KEYS",
    "REDACTED",
    "Detector",
    "RedactedArgs",
    "Redactor",
    "RegexDetector",
    "default_detectors",
    "luhn_ok",
]

REDACTED: Final = "[REDACTED]"
"""The marker that replaces a secret: a whole value, or the matched part of a longer string."""

DEFAULT_SECRET_KEYS: tuple[str, ...] = (
    "password",
    "passwd",
    "passphrase",
    "passcode",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "privkey",
    "authorization",
    "authkey",
    "credential",
    "cookie",
    "sessionid",
    "cvv",
    "cvc",
)
"""Key words whose presence in a key name marks its value as secret.

A key matches when, lower-cased and with "-" and "_" removed, it contains one of these words:
"api_key", "X-Api-Key", "apiKey", "db_password", "client_secret", "Authorization", "access_token",
"Set-Cookie", "session_id", "credentials" all match. Deliberately absent: "auth" (it would match
"author"), "pwd" (shell tools use it for the working directory), "pin" and "ssn" (they occur inside
ordinary words such as "shipping" and "business"). "token" also matches counters such as
"max_tokens"; that costs a number in the audit trail, never a secret.

The same test applies to the key name before ":" or "=" inside text, so "max_tokens: 512" loses its
number there too, and so does "Password: must be 12 characters" its first word; "passwords are
rotated", with no separator after the key word, is left alone.
"""

_KEY_CACHE_LIMIT = 4096
# Keys come from model-written arguments, so the set of distinct keys is open-ended; past this many
# the memo stops growing (decisions are still computed, just not remembered). The same holds, in a
# memo of their own, for the names before ":" and "=" in free text (JSON keys must not be crowded out).

_SIZE_PER_NODE = 32
# An upper bound on what one JSON value adds besides its string characters: quotes, ", ", ": ",
# brackets, a float's repr (at most 24 characters) or an int of at most 20 characters.

_SIZE_PER_CHAR = 12
# json.dumps escapes one character into at most 12 (a surrogate pair of \uXXXX escapes).

_REDACTED_SIZE = _SIZE_PER_CHAR * len(REDACTED) + _SIZE_PER_NODE

_SCAN_NUMBERS_FROM = 10_000_000
# Numbers of 8 digits or more are scanned as their decimal text (a card number sent as an int); no
# default detector matches fewer digits, so smaller ones, by far the most common, skip the scan.

_ERROR_TEXT_LIMIT = 200

_NO_DIGIT_DETECTOR = sys.maxsize

_DIGITS: Final = b"0123456789"

_DOUBLE_DIGIT: Final = bytes.maketrans(b"0123456789", b"0246813579")
# Luhn doubles every second digit from the right and adds the digits of the product: 7 -> 14 -> 5.


def luhn_ok(digits: str) -> bool:
    """True when `digits` (ASCII digits only) passes the Luhn checksum used by payment card numbers.

    Returns False for an empty string or one holding anything but ASCII digits; never raises.
    """
    return digits.isascii() and digits.isdigit() and _luhn(digits)


def _luhn(digits: str) -> bool:
    codes = digits.encode()
    # Summing byte values in C is several times faster than a Python loop over the digits.
    return (sum(codes[-1::-2]) + sum(codes[-2::-2].translate(_DOUBLE_DIGIT)) - 48 * len(codes)) % 10 == 0


def _digit_count(text: str) -> int:
    """How many ASCII digits `text` holds (non-ASCII characters are dropped first: none is an ASCII digit)."""
    codes = text.encode("ascii", "ignore")
    return len(codes) - len(codes.translate(None, _DIGITS))


@dataclass(frozen=True, slots=True)
class RedactedArgs:
    """The outcome of `Redactor.redact_args`.

    `args` is a JSON-safe copy of the arguments with secrets replaced, `{"_truncated": "<JSON text>"}`
    when they were oversized, or None when redaction failed (the arguments are then dropped, never
    passed on raw). `redacted_paths` holds the RFC 6901 JSON pointer of every replaced value, in
    traversal order. `truncated` says the arguments were cut. `error` is "<ExcType>: <text>" when the
    redactor itself failed, else None.
    """

    args: dict[str, Any] | None
    redacted_paths: tuple[str, ...]
    truncated: bool
    error: str | None


_new_result = object.__new__
_RESULT_SLOTS: Any = RedactedArgs.__dict__
_set_args: Callable[[RedactedArgs, Any], None] = _RESULT_SLOTS["args"].__set__
_set_paths: Callable[[RedactedArgs, Any], None] = _RESULT_SLOTS["redacted_paths"].__set__
_set_truncated: Callable[[RedactedArgs, Any], None] = _RESULT_SLOTS["truncated"].__set__
_set_error: Callable[[RedactedArgs, Any], None] = _RESULT_SLOTS["error"].__set__


def _result(args: dict[str, Any] | None, paths: tuple[str, ...], truncated: bool, error: str | None) -> RedactedArgs:
    """`RedactedArgs(args, paths, truncated, error)`, built in half the time.

    A frozen dataclass's __init__ goes through object.__setattr__ once per field; on the hot path,
    setting the slots directly saves as much as the redaction of a short string costs.
    """
    result: RedactedArgs = _new_result(RedactedArgs)
    _set_args(result, args)
    _set_paths(result, paths)
    _set_truncated(result, truncated)
    _set_error(result, error)
    return result


class Detector(Protocol):
    """Finds secrets inside a string.

    `find` returns the (start, end) spans of the secrets in `text`, in any order, possibly overlapping;
    the redactor merges them and replaces each merged span by `REDACTED`. Spans reaching outside the
    text are clipped. `find` may raise: `Redactor.redact_args` then drops the arguments (fails closed)
    and `Redactor.redact_text` returns `REDACTED`. It must be safe to call from many threads at once.
    """

    name: str

    def find(self, text: str) -> list[tuple[int, int]]:
        """The spans of the secrets in `text`."""
        ...


class RegexDetector:
    """A detector made of one regular expression: each match (or its `group`) is a secret.

    `pattern` is a string or a compiled pattern; `group` selects the part of each match to replace
    (0, the default, is the whole match; a group that did not take part in a match is skipped).
    Raises `ValueError` at construction when `group` does not exist in `pattern` (and `re.error` for
    an invalid pattern). Immutable and thread-safe.
    """

    __slots__ = ("group", "name", "pattern")

    def __init__(self, name: str, pattern: str | re.Pattern[str], *, group: int | str = 0) -> None:
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        if isinstance(group, str):
            if group not in compiled.groupindex:
                raise ValueError(f"pattern of detector {name!r} has no group named {group!r}")
        elif not 0 <= group <= compiled.groups:
            raise ValueError(f"pattern of detector {name!r} has no group {group}")
        self.name = name
        self.pattern = compiled
        self.group = group

    def find(self, text: str) -> list[tuple[int, int]]:
        """The spans of every match of the pattern (or of its group) in `text`."""
        group = self.group
        if group == 0:
            return [match.span() for match in self.pattern.finditer(text) if match.end() > match.start()]
        spans: list[tuple[int, int]] = []
        for match in self.pattern.finditer(text):
            start, end = match.span(group)
            if start < end:
                spans.append((start, end))
        return spans

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.pattern.pattern!r})"


class _AnchoredDetector(RegexDetector):
    """A default detector, with what lets the redactor skip it cheaply.

    Each anchor is (first character, regex tail): the character followed by the tail must match
    somewhere in every text in which `find` reports a span. `min_digits` is another such condition:
    the text holds at least that many ASCII digits. The redactor runs `find` only on texts that meet
    one of them.
    """

    __slots__ = ("anchors", "min_digits")

    def __init__(
        self,
        name: str,
        pattern: str | re.Pattern[str],
        anchors: Mapping[str, str],
        *,
        group: int | str = 0,
        min_digits: int = 0,
    ) -> None:
        super().__init__(name, pattern, group=group)
        self.anchors: tuple[tuple[str, str], ...] = tuple(anchors.items())
        self.min_digits = min_digits


_CARD_RUN = re.compile(r"[0-9](?<![0-9][0-9])(?=[0-9 -]{12})[0-9]*(?:[ -][0-9]+)*")
# A maximal run of digits, single spaces or dashes allowed between them, at least 13 characters
# long. It starts with a digit class (not the lookbehind) so that re scans for digits in C; the
# lookahead drops short numbers (dates, ids) without a Python iteration; and it has only
# single-character repeats (a repeated group holding an optional separator is several times slower).


class _CardNumberDetector(_AnchoredDetector):
    """Payment card numbers: 13 to 19 digits, optionally grouped by single spaces or dashes, Luhn-valid.

    A run of digit groups longer than a card (a quantity before a card number, as in "qty 2 4111 1111
    1111 1111") is searched for Luhn-valid stretches of whole groups. Digits glued to other digits
    are one number and are not split: a 20-digit id is not a card.
    """

    __slots__ = ()

    def find(self, text: str) -> list[tuple[int, int]]:
        """The spans of the card numbers in `text`."""
        spans: list[tuple[int, int]] = []
        for match in _CARD_RUN.finditer(text):
            run = match.group()
            if len(run) < 13:
                continue
            digits = run.replace(" ", "").replace("-", "")
            if 13 <= len(digits) <= 19 and _luhn(digits):
                spans.append(match.span())
                continue
            if len(digits) == len(run) or len(digits) < 13:
                # Digits glued together are one number: only separators mark where a card may start.
                continue
            groups = run.replace("-", " ").split(" ")
            if len(digits) - len(groups[0]) < 13 and len(digits) - len(groups[-1]) < 13:
                continue  # no stretch of whole groups short of the entire run has 13 digits
            starts = []
            position = match.start()
            for group in groups:
                starts.append(position)
                position += len(group) + 1
            for first in range(len(groups)):
                stretch = ""
                for last in range(first, len(groups)):
                    stretch += groups[last]
                    if len(stretch) > 19:
                        break
                    if len(stretch) >= 13 and _luhn(stretch):
                        spans.append((starts[first], starts[last] + len(groups[last])))
        return spans


def _ascii(pattern: re.Pattern[Any]) -> re.Pattern[str]:
    """A detect-secrets pattern recompiled with re.ASCII, so that \\d, \\w and \\s agree with the anchors."""
    return re.compile(str(pattern.pattern), (pattern.flags & ~re.UNICODE) | re.ASCII)


_QUOTED_40_ANCHOR = r"[0-9a-zA-Z/+]{40}['\"]"
_PEM = (
    r"(?:-{2,}[ ]?)?BEGIN[ ][A-Z0-9 ]{0,40}PRIVATE[ ]KEY(?:[ ]BLOCK)?[ -]*[\s\S]*?"
    r"(?:END[ ][A-Z0-9 ]{0,40}PRIVATE[ ]KEY(?:[ ]BLOCK)?[ ]?-*|\Z)"
)
# The whole block, body included; a block cut before its END line is redacted to the end of the text.
_PUTTY = r"PuTTY-User-Key-File-[0-9]+:[\s\S]*?(?:Private-MAC:[ ]*[0-9A-Fa-f]+|\Z)"
_AUTH_SCHEME = r"(?:(?:basic|bearer|digest|negotiate|ntlm|token|apikey|aws4-hmac-sha256)[ \t]+)"
# The words before the credentials of an Authorization value; they stay visible, the credentials go.
_AUTHORIZATION = (
    r"(?i)\b(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    rf"{_AUTH_SCHEME}?"
    r"([^\s\"',;]+(?:[ \t]+[^\s\"',;]+)*)"
)
# The value runs to the end of the line (or a quote, comma or semicolon): a scheme this list does not
# know is then redacted along with the credentials rather than mistaken for them.
_SECRET_VALUE = re.compile(
    r"[=>]?[ \t]*(?:"
    rf"\"(?i:{_AUTH_SCHEME})?((?:[^\"\\\r\n]++|\\.)*+)"
    rf"|'(?i:{_AUTH_SCHEME})?((?:[^'\\\r\n]++|\\.)*+)"
    rf"|\\\"(?i:{_AUTH_SCHEME})?((?:[^\\\r\n]++|\\[^\"\r\n])*+)"
    rf"|(?i:{_AUTH_SCHEME})?([^\s&;,\"']++(?:[\"']++[^\s&;,\"']++)*+)"
    r")"
)
# What follows the separator of a secret key in free text; the one group that takes part is the
# secret. A quoted value ("...", '...', or \"...\" of JSON inside a JSON string) runs to its closing
# quote, or to the end of the line when there is none; an unquoted one to whitespace, "&", ";", "," or
# the end, quotes at its end excluded (they close the string around it: curl 'https://x?token=abc').
# "=>" and ":=" are one separator. An Authorization scheme before the value stays visible.
_OPENS_QUOTE = re.compile(r"[=>]?[ \t]*\\?[\"']")
# A value after a separator that starts with a quote (see _SECRET_VALUE).
_KEY_BEFORE = re.compile(r"[ \t]*[\"']?\\?([\w.-]+)")
# The key name before a separator, matched in the reversed text: blanks, a closing quote (perhaps
# escaped by a backslash), then the name, last letter first.
_GITLAB_PREFIX_ANCHOR = r"(?:(?<=gl[dfr]t-)|(?<=gl(?:pat|cbt|imt|ptt|oas)-)|(?<=glsoat-)|(?<=glagent-))"


@functools.cache
def _build_default_detectors() -> tuple[_AnchoredDetector, ...]:
    # detect-secrets imports requests; importing it here keeps `import events.redaction` light.
    from detect_secrets.plugins.aws import AWSKeyDetector
    from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
    from detect_secrets.plugins.basic_auth import BasicAuthDetector
    from detect_secrets.plugins.discord import DiscordBotTokenDetector
    from detect_secrets.plugins.github_token import GitHubTokenDetector
    from detect_secrets.plugins.mailchimp import MailchimpDetector
    from detect_secrets.plugins.openai import OpenAIDetector
    from detect_secrets.plugins.pypi_token import PypiTokenDetector
    from detect_secrets.plugins.sendgrid import SendGridDetector
    from detect_secrets.plugins.slack import SlackDetector
    from detect_secrets.plugins.square_oauth import SquareOAuthDetector
    from detect_secrets.plugins.stripe import StripeDetector
    from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
    from detect_secrets.plugins.twilio import TwilioKeyDetector

    def joined(*patterns: re.Pattern[Any] | str) -> re.Pattern[str]:
        sources = [pattern if isinstance(pattern, str) else str(pattern.pattern) for pattern in patterns]
        return re.compile("|".join(f"(?:{source})" for source in sources), re.ASCII)

    github = GitHubTokenDetector.denylist[0].pattern
    stripe = StripeDetector.denylist[0].pattern
    return (
        _CardNumberDetector("card_number", _CARD_RUN, {}, min_digits=13),
        _AnchoredDetector(
            "private_key",
            re.compile(f"(?:{_PEM})|(?:{_PUTTY})", re.ASCII),
            {"P": r"(?:RIVATE[ ]KEY|uTTY-User-Key-File-)"},
        ),
        _AnchoredDetector(
            "aws_access_key_id",
            _ascii(AWSKeyDetector.denylist[0]),
            {"A": r"(?:3T[A-Z0-9]|BIA|CCA|KIA|SIA)"},
        ),
        _AnchoredDetector(
            "aws_secret_access_key",
            _ascii(AWSKeyDetector.denylist[1]),
            {"'": _QUOTED_40_ANCHOR, '"': _QUOTED_40_ANCHOR},
            group=1,
        ),
        _AnchoredDetector("azure_storage_key", _ascii(AzureStorageKeyDetector.denylist[0]), {"A": "ccountKey="}),
        _AnchoredDetector("google_api_key", re.compile(r"AIza[0-9A-Za-z_-]{35}", re.ASCII), {"A": "Iza"}),
        _AnchoredDetector(
            "twilio_key",
            joined(*TwilioKeyDetector.denylist),
            {"A": "C[a-z0-9]{32}", "S": "K[a-z0-9]{32}"},
        ),
        _AnchoredDetector("sendgrid_key", _ascii(SendGridDetector.denylist[0]), {"S": r"G\."}),
        _AnchoredDetector(
            "github_token",
            # detect-secrets' fixed length would leave the tail of a longer token in the text.
            joined(f"(?:{github})[A-Za-z0-9_]*", r"github_pat_[A-Za-z0-9_]{22,}"),
            {"_": r"(?:(?<=gh[pousr]_)|(?<=github_)pat_)"},
        ),
        _AnchoredDetector(
            "gitlab_token",
            # A superset of detect-secrets' GitLab patterns: their upper length bounds followed by (?!\w)
            # let a longer token through whole.
            re.compile(
                r"(?:gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-|GR1348941)[A-Za-z0-9_-]{20,}(?:\.[A-Za-z0-9_-]+)*",
                re.ASCII,
            ),
            {"-": _GITLAB_PREFIX_ANCHOR, "G": "R1348941"},
        ),
        _AnchoredDetector(
            "slack_token",
            _ascii(SlackDetector.denylist[0]),
            {"-": "(?<=[Xx][Oo][Xx][AaBbPpOoSsRr]-)"},
        ),
        _AnchoredDetector("slack_webhook", _ascii(SlackDetector.denylist[1]), {":": "//"}),
        _AnchoredDetector("url_credentials", _ascii(BasicAuthDetector.denylist[0]), {":": "//"}, group=1),
        _AnchoredDetector(
            "jwt",
            # detect-secrets' pattern ends in a lazy quantifier, so its matches stop before the signature.
            # Dots only between segments: a full stop after the token is not part of it.
            re.compile(r"eyJ[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+(?:\.[A-Za-z0-9_+/=-]+)*", re.ASCII),
            {"J": "(?<=eyJ)"},
        ),
        _AnchoredDetector(
            "stripe_key",
            joined(f"(?:{stripe})[0-9a-zA-Z]*", r"[rs]k_test_[0-9a-zA-Z]{24,}", r"whsec_[0-9a-zA-Z]{24,}"),
            {"_": r"(?:(?<=[rs]k_)(?:live|test)_|(?<=whsec_))"},
        ),
        _AnchoredDetector(
            "openai_key",
            # detect-secrets only knows the legacy keys with the T3BlbkFJ marker; "sk-proj-...",
            # "sk-svcacct-..." and Anthropic's "sk-ant-..." keys have none.
            joined(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}", OpenAIDetector.denylist[0]),
            {"-": "(?<=sk-)"},
        ),
        _AnchoredDetector("mailchimp_key", _ascii(MailchimpDetector.denylist[0]), {"-": "us[0-9]"}),
        _AnchoredDetector("pypi_token", joined(*PypiTokenDetector.denylist), {"-": "(?<=pypi-)"}),
        _AnchoredDetector("square_oauth_secret", _ascii(SquareOAuthDetector.denylist[0]), {"-": "(?<=sq0csp-)"}),
        _AnchoredDetector(
            "npm_token",
            joined(r"(?<=_authToken=)[ \t]*[^\s\"']+", r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36,}"),
            {"_": r"(?:authToken=|(?<=npm_))"},
        ),
        _AnchoredDetector(
            "huggingface_token",
            re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}", re.ASCII),
            {"_": "(?<=hf_)"},
        ),
        _AnchoredDetector(
            "telegram_bot_token",
            _ascii(TelegramBotTokenDetector.denylist[0]),
            {":": "(?<=[0-9]{8}:)"},
        ),
        _AnchoredDetector(
            "discord_bot_token",
            _ascii(DiscordBotTokenDetector.denylist[0]),
            dict.fromkeys("MNO", r"[a-zA-Z0-9_-]{23,25}\."),
        ),
        _AnchoredDetector(
            "bearer_token",
            re.compile(r"(?i)\bbearer[ \t]+([A-Za-z0-9._~+/-]+=*)", re.ASCII),
            dict.fromkeys("bB", "[Ee][Aa][Rr][Ee][Rr]"),
            group=1,
        ),
        _AnchoredDetector(
            "authorization_header",
            re.compile(_AUTHORIZATION, re.ASCII),
            # On the rare "z": anchored on "a", the gate would stop in nearly every word.
            dict.fromkeys("zZ", "(?<=[Aa][Uu][Tt][Hh][Oo][Rr][Ii][Zz])[Aa][Tt][Ii][Oo][Nn]"),
            group=1,
        ),
    )


def default_detectors() -> list[Detector]:
    """A new list of the built-in content detectors (the detectors themselves are shared and immutable).

    Payment card numbers (13 to 19 digits, grouped by single spaces or dashes or not at all, Luhn-checked;
    digits glued to other digits are one longer number, not a card), PEM and PuTTY private keys, AWS
    access key ids and quoted secret keys, Azure storage keys, Google API keys, Twilio, SendGrid,
    GitHub, GitLab, Slack tokens and webhooks, credentials in URLs, JWTs, Stripe, OpenAI-style "sk-"
    keys, Mailchimp, PyPI, Square, npm, Hugging Face, Telegram and Discord bot tokens, "Bearer <token>"
    and "Authorization: <credentials>". Most patterns come from detect-secrets' plugins, imported on
    the first call (which may take a tenth of a second); its keyword and high-entropy plugins are not
    used. Never raises.
    """
    return list(_build_default_detectors())


def _normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


_BAD_POINTER_ESCAPE = re.compile(r"~(?![01])")


def _key_text(key: Any) -> str:
    """The JSON object key json.dumps would write for `key` (its str() where json.dumps would refuse)."""
    if isinstance(key, enum.Enum):
        key = key.value
    if isinstance(key, str):
        return str.__str__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    return _safe_str(key)


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        # A broken __str__ must not fail the whole call; the type is enough for an audit trail.
        return f"<{type(value).__name__}>"


def _non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _convert(value: Any) -> Any:
    """A JSON-native stand-in for a value that is not a str, int, float, bool, None, mapping, list or tuple.

    Enums become their value, str/int/float subclasses their plain value, pydantic models
    `model_dump(mode="json")`, dataclass instances a dict of their fields, sets a (sorted when
    possible) list, other sequences a list, bytes "<N bytes>", dates and times their ISO text, anything
    else its str().
    """
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, memoryview):
        return f"<{value.nbytes} bytes>"
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, Sequence):
        return list(value)
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    return _safe_str(value)


def _json_safe(value: Any) -> Any:
    """A JSON-safe deep copy of `value` with nothing redacted (used when redaction is disabled)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else _non_finite(value)
    if isinstance(value, Mapping):
        return {_key_text(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return _json_safe(_convert(value))


def _apply(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each merged span replaced by REDACTED (spans clipped to the text, empty ones ignored)."""
    size = len(text)
    if len(spans) == 1:
        start, end = spans[0]
        if start < 0:
            start = 0
        if end > size:
            end = size
        return text[:start] + REDACTED + text[end:] if start < end else text
    spans.sort()
    pieces: list[str] = []
    kept = 0
    current_start = -1
    current_end = -1
    for raw_start, raw_end in spans:
        start = max(raw_start, 0)
        end = min(raw_end, size)
        if start >= end:
            continue
        if start <= current_end:
            current_end = max(current_end, end)
            continue
        if current_start >= 0:
            pieces.append(text[kept:current_start])
            pieces.append(REDACTED)
            kept = current_end
        current_start, current_end = start, end
    if current_start < 0:
        return text
    pieces.append(text[kept:current_start])
    pieces.append(REDACTED)
    pieces.append(text[current_end:])
    return "".join(pieces)


def _never(text: str) -> None:
    """The quick check of a redactor without anchored detectors: no anchor ever occurs."""
    return None


_NEVER_MATCHES = re.compile(r"(?!)")


_BACKREFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")


def _scoped(pattern: re.Pattern[str]) -> str:
    """`pattern` as a group carrying its own flags, to be joined with others into one alternation."""
    letters = "".join(
        letter
        for flag, letter in (
            (re.ASCII, "a"),
            (re.IGNORECASE, "i"),
            (re.MULTILINE, "m"),
            (re.DOTALL, "s"),
            (re.VERBOSE, "x"),
        )
        if pattern.flags & flag
    )
    return f"(?{letters}:{pattern.pattern})" if letters else f"(?:{pattern.pattern})"


class Redactor:
    """Replaces secrets in tool-call arguments and error texts by `REDACTED`.

    Construct once and share: a Redactor is immutable after construction (its only mutable parts are
    two bounded memos of key-name decisions, which need no lock) and safe to use from many threads at
    once. The constructor raises `ValueError` or `TypeError` for an invalid configuration;
    `redact_args` and `redact_text` never raise.

    `detectors`: the content detectors (None = `default_detectors()`, [] = none); `extra_detectors`
    are added to them. `secret_keys`: key words marking secret values (None = `DEFAULT_SECRET_KEYS`);
    each matches case-insensitively as a substring of a key after "-" and "_" are removed, and of a
    key name written before ":" or "=" inside any string (see `redact_text`). `paths`: JSON pointers
    per tool name that are always replaced when present (the tool name "*" applies to every tool);
    pointers match exactly, list indices included. `max_chars`: arguments whose JSON text is longer
    are cut (after redaction). `enabled=False` passes arguments through unredacted (still as a
    JSON-safe copy, never cut) and makes `redact_text` return its input.
    """

    __slots__ = (
        "_digit_mask",
        "_enabled",
        "_fire",
        "_fire_all",
        "_gate",
        "_gated",
        "_key_cache",
        "_key_pattern",
        "_max_chars",
        "_min_digits",
        "_only_gated",
        "_other",
        "_quick",
        "_star_paths",
        "_text_key_cache",
        "_tool_paths",
        "_user_gate",
        "_user_gated",
    )

    def __init__(
        self,
        *,
        detectors: Sequence[Detector] | None = None,
        extra_detectors: Sequence[Detector] = (),
        secret_keys: Sequence[str] | None = None,
        paths: Mapping[str, Sequence[str]] | None = None,
        max_chars: int = 16_384,
        enabled: bool = True,
    ) -> None:
        chosen: list[Detector] = [*(default_detectors() if detectors is None else detectors), *extra_detectors]
        for detector in chosen:
            if not isinstance(getattr(detector, "name", None), str) or not callable(getattr(detector, "find", None)):
                raise TypeError(f"a detector needs a str `name` and a `find(text)` method, got {detector!r}")
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars must be a positive int, got {max_chars!r}")
        self._enabled = bool(enabled)
        self._max_chars = max_chars
        self._key_pattern = _compile_keys(DEFAULT_SECRET_KEYS if secret_keys is None else secret_keys)
        self._key_cache: dict[str, tuple[bool, str]] = {}
        self._text_key_cache: dict[str, bool] = {}
        self._tool_paths, self._star_paths = _compile_paths(paths or {})

        anchored = [detector for detector in chosen if isinstance(detector, _AnchoredDetector)]
        rest = [detector for detector in chosen if not isinstance(detector, _AnchoredDetector)]
        self._gated: tuple[_AnchoredDetector, ...] = tuple(anchored)
        self._gate, self._fire = _compile_gate(anchored)
        self._fire_all = functools.reduce(int.__or__, self._fire.values(), 0)
        self._digit_mask = 0
        self._min_digits = _NO_DIGIT_DETECTOR
        for index, detector in enumerate(anchored):
            if detector.min_digits > 0:
                self._digit_mask |= 1 << index
                self._min_digits = min(self._min_digits, detector.min_digits)

        # Plain RegexDetectors share one prefilter, so a string none of them matches costs one search.
        # Patterns with backreferences would change meaning once their groups are renumbered.
        mergeable = [
            detector
            for detector in rest
            if type(detector) is RegexDetector and not _BACKREFERENCE.search(detector.pattern.pattern)
        ]
        self._user_gate: re.Pattern[str] | None = None
        if len(mergeable) > 1:
            try:
                self._user_gate = re.compile("|".join(_scoped(detector.pattern) for detector in mergeable))
            except re.error:
                mergeable = []
        else:
            mergeable = []
        self._user_gated: tuple[Detector, ...] = tuple(mergeable)
        merged = {id(detector) for detector in mergeable}
        self._other: tuple[Detector, ...] = tuple(detector for detector in rest if id(detector) not in merged)
        self._quick: Callable[[str], re.Match[str] | None] = self._gate.search if self._fire else _never
        self._only_gated = self._user_gate is None and not self._other

    @property
    def max_chars(self) -> int:
        """Arguments whose JSON text is longer than this are cut."""
        return self._max_chars

    @property
    def enabled(self) -> bool:
        """False for a redactor built with `enabled=False` (it redacts nothing)."""
        return self._enabled

    def detector_spans(self, text: str, *, digits: bool = True) -> list[tuple[int, int]]:
        """The (start, end) spans the content detectors find in `text`, unmerged, in no set order.

        Values after secret key names are not included (see `key_value_spans`). `digits=False`
        skips the built-in detectors that run on a count of digits alone (card numbers). [] when
        disabled. Unlike `redact_text`, raises what a detector raises.
        """
        if not self._enabled:
            return []
        return self._spans(text, self._quick(text), None if digits else False, key_values=False)

    def may_match(self, text: str) -> bool:
        """False when no content detector can find anything in `text`: none of the built-in
        detectors' anchors occurs in it (card numbers aside) and no other detector is configured.
        One scan in C; a quick test before building views of a text. Never raises."""
        if not self._enabled:
            return False
        return self._quick(text) is not None or not self._only_gated

    def key_value_spans(self, text: str) -> list[tuple[int, int]]:
        """The spans of the values written after secret key names in `text` ("password=[...]"), as
        `redact_text` finds them. [] when disabled or without secret keys. Never raises."""
        if not self._enabled or self._key_pattern is None or ("=" not in text and ":" not in text):
            return []
        return self._key_value_spans(text)

    def is_secret_key(self, key: str) -> bool:
        """Does the secret-key rule mark a value under the key name `key`? False when disabled."""
        if not self._enabled:
            return False
        info = self._key_cache.get(key)
        return (info if info is not None else self._key_info(key))[0]

    @classmethod
    def none(cls) -> Redactor:
        """A redactor with no detectors, no secret keys and no paths (still enabled: oversize still cuts)."""
        return cls(detectors=[], secret_keys=[], paths=None)

    def redact_text(self, text: str) -> str:
        """`text` with every span the content detectors find replaced by `REDACTED` (for error messages).

        Secret keys apply to the values written after them: where a key name holding a secret key word
        (tested as a JSON key is) is followed by ":" or "=" (blanks around it allowed, the key perhaps
        quoted, as in JSON), the value after it is replaced and the key name kept. A quoted value
        ("...", '...', or \\"...\\" of JSON inside a JSON string) is replaced up to its closing quote
        (the end of the line if there is none), an unquoted one up to whitespace, "&", ";", "," or the
        end (quotes closing the surrounding string are kept). "password: 'hunter2'" becomes
        "password: '[REDACTED]'", "?token=abc&page=2" becomes "?token=[REDACTED]&page=2". An
        Authorization scheme ("Bearer", "Basic", ...) before the value stays. Paths do not apply to
        free text. `redact_args` applies the same to every string in the arguments.

        Returns `text` unchanged when disabled. Never raises: if a detector fails, the whole text is
        replaced by `REDACTED` (fails closed).
        """
        if not self._enabled:
            return text
        try:
            spans = self._spans(text, self._quick(text))
            return _apply(text, spans) if spans else text
        except Exception:
            return REDACTED

    def redact_args(self, tool: str, args: Mapping[str, Any]) -> RedactedArgs:
        """The redacted, JSON-safe copy of one tool call's arguments, with the pointers of what was replaced.

        Inside every string, the values after secret key names are replaced as `redact_text` says, and
        the string's pointer is recorded (like any other in-text detection). The input is never
        mutated. Never raises: if anything fails (a detector raising, a cycle in the arguments, a value
        that cannot be converted), the result has `args=None` and `error` set, so the raw arguments
        never leave. Arguments whose JSON text (json.dumps, default=str) is longer
        than `max_chars` come back as `{"_truncated": "<its first max_chars characters>"}`, cut after
        redaction so the cut text holds no secret either.
        """
        try:
            return self._redact_args(tool, args)
        except Exception as exc:
            return _result(None, (), False, self._describe(exc))

    def _describe(self, exc: Exception) -> str:
        """ "<ExcType>: <message>", the message redacted: it may quote the very text being scanned."""
        message = _safe_str(exc)
        if self._enabled:
            try:
                spans = self._spans(message, self._quick(message))
            except Exception:
                # Most likely the detector that raised in the first place: the built-in detectors,
                # which do not raise, still clean the message.
                try:
                    spans = self._spans(message, self._quick(message), builtin_only=True)
                except Exception:
                    return f"{type(exc).__name__}: {REDACTED}"
            message = _apply(message, spans) if spans else message
        if len(message) > _ERROR_TEXT_LIMIT:
            message = message[:_ERROR_TEXT_LIMIT] + "…"
        return f"{type(exc).__name__}: {message}"

    def _redact_args(self, tool: str, args: Mapping[str, Any]) -> RedactedArgs:
        source: Any = args
        if type(source) is not dict and not isinstance(source, Mapping):
            source = _convert(source)
            if not isinstance(source, Mapping):
                raise TypeError(f"args must be a mapping, got {type(args).__name__}")
        if not self._enabled:
            return _result(_json_safe(source), (), False, None)
        found: list[str] = []
        size = [2]
        copied = self._walk_mapping(source, "", self._tool_paths.get(tool, self._star_paths), found, size)
        # The bound is cheap and nearly always far below the limit; only above it is the JSON text,
        # which costs more than the whole redaction of a small call, computed.
        if size[0] > self._max_chars:
            text = json.dumps(copied, default=str)
            if len(text) > self._max_chars:
                return _result({"_truncated": text[: self._max_chars]}, tuple(found), True, None)
        return _result(copied, tuple(found), False, None)

    def _spans(
        self,
        text: str,
        hit: re.Match[str] | None,
        enough_digits: bool | None = None,
        *,
        builtin_only: bool = False,
        key_values: bool = True,
    ) -> list[tuple[int, int]]:
        """The spans every detector finds in `text`.

        `hit` is the gate's first match in `text` (or None); `enough_digits` whether it holds enough
        digits for the digit-counting detectors, when the caller already knows. `builtin_only` skips
        the detectors given by the user; `key_values=False` the values after secret key names.
        """
        fired = 0
        if hit is not None:
            gate = self._gate
            fire = self._fire
            everything = self._fire_all
            # Continue one character after each hit, not after its end: another anchor may start inside.
            while hit is not None:
                start = hit.start()
                fired |= fire[text[start]]
                if fired == everything:
                    break
                hit = gate.search(text, start + 1)
        if enough_digits is None:
            enough_digits = len(text) >= self._min_digits and _digit_count(text) >= self._min_digits
        if enough_digits:
            fired |= self._digit_mask
        spans: list[tuple[int, int]] = []
        gated = self._gated
        while fired:
            lowest = fired & -fired
            spans += gated[lowest.bit_length() - 1].find(text)
            fired ^= lowest
        if not self._only_gated and not builtin_only:
            user_gate = self._user_gate
            if user_gate is not None and user_gate.search(text) is not None:
                for detector in self._user_gated:
                    spans += detector.find(text)
            for detector in self._other:
                spans += detector.find(text)
        if key_values and self._key_pattern is not None and ("=" in text or ":" in text):
            spans += self._key_value_spans(text)
        return spans

    def _key_value_spans(self, text: str) -> list[tuple[int, int]]:
        """The spans of the values written after secret key names in `text`: "password=...", "api_key: ...".

        Each ":" or "=" is a candidate separator, in the order they occur; the key name before it (the
        run of word characters, "." and "-" that ends there, optionally closed by a quote, itself
        backslash-escaped or not) is normalised and tested as a JSON key is. What follows is
        `_SECRET_VALUE`. str.find skips to the separators far faster than a regular expression scans
        for them, and ordinary text holds few, so the loop runs a handful of times: the key words are
        never tried at every letter. The cost stays linear in the length of the text, whatever it holds.
        """
        spans: list[tuple[int, int]] = []
        cache = self._text_key_cache
        after = len(text) + 1
        reverse = text[::-1]
        covered = -1  # where the values found so far end: a separator before it lies inside one
        colon = text.find(":")
        equals = text.find("=")
        while colon >= 0 or equals >= 0:
            if equals < 0 or 0 <= colon < equals:
                at = colon
                colon = text.find(":", at + 1)
            else:
                at = equals
                equals = text.find("=", at + 1)
            # In the reversed text, the key name starts right after the separator.
            key = _KEY_BEFORE.match(reverse, after - at - 1)
            if key is None:
                continue
            name = key.group(1)
            secret = cache.get(name)
            if secret is None:
                secret = self._text_key_info(name)
            if not secret:
                continue
            if at < covered and _OPENS_QUOTE.match(text, at + 1) is None:
                # An unquoted value that starts inside one already found ends where that one ends, or
                # runs on only past the closing quote of a quoted one. Scanning it again would make
                # "token=token=token=..." cost the square of its length.
                continue
            value = _SECRET_VALUE.match(text, at + 1)
            if value is not None and value.lastindex is not None:
                start, end = value.span(value.lastindex)
                if start < end:
                    spans.append((start, end))
                    covered = max(covered, end)
        return spans

    def _text_key_info(self, reversed_name: str) -> bool:
        """Is the key name spelled backwards by `reversed_name` secret? Remembered while the memo has room."""
        pattern = self._key_pattern
        secret = pattern is not None and pattern.search(_normalize_key(reversed_name[::-1])) is not None
        if len(self._text_key_cache) < _KEY_CACHE_LIMIT:
            self._text_key_cache[reversed_name] = secret
        return secret

    def _redact_key_values(self, text: str, path: str, found: list[str]) -> str:
        """`_redact_string` for a string in which no detector can fire: only values after key names go."""
        spans = self._key_value_spans(text)
        if not spans:
            return text
        redacted = _apply(text, spans)
        if redacted is not text:
            found.append(path)
        return redacted

    def _redact_string(
        self, text: str, hit: re.Match[str] | None, path: str, found: list[str], enough_digits: bool | None = None
    ) -> str:
        spans = self._spans(text, hit, enough_digits)
        if not spans:
            return text
        redacted = _apply(text, spans)
        if redacted is not text:
            found.append(path)
        return redacted

    def _key_info(self, key: str) -> tuple[bool, str]:
        pattern = self._key_pattern
        info = (pattern is not None and pattern.search(_normalize_key(key)) is not None, "/" + _escape_pointer(key))
        if len(self._key_cache) < _KEY_CACHE_LIMIT:
            self._key_cache[key] = info
        return info

    def _walk_mapping(
        self, value: Mapping[Any, Any], path: str, extra: frozenset[str] | None, found: list[str], size: list[int]
    ) -> dict[str, Any]:
        cache = self._key_cache
        quick = self._quick
        only_gated = self._only_gated
        min_digits = self._min_digits
        keyed = self._key_pattern is not None
        copied: dict[str, Any] = {}
        bound = 0
        for raw_key, item in value.items():
            key = raw_key if type(raw_key) is str else _key_text(raw_key)
            info = cache.get(key)
            if info is None:
                info = self._key_info(key)
            bound += _SIZE_PER_CHAR * len(key) + _SIZE_PER_NODE
            if info[0]:
                found.append(path + info[1])
                bound += _REDACTED_SIZE
                copied[key] = REDACTED
                continue
            # The common leaves (a string with no anchor, too few digits and no ":" or "=", a short
            # number) are settled here: a method call per leaf would cost as much as the scan itself.
            if extra is None and only_gated:
                kind = type(item)
                if kind is str:
                    bound += _SIZE_PER_CHAR * len(item) + _SIZE_PER_NODE
                    hit = quick(item)
                    if hit is None and (len(item) < min_digits or _digit_count(item) < min_digits):
                        # No detector can fire; only a value after a secret key name may be left.
                        if keyed and (":" in item or "=" in item):
                            copied[key] = self._redact_key_values(item, path + info[1], found)
                        else:
                            copied[key] = item
                    else:
                        # Without a hit, the digits are what brought the string here.
                        copied[key] = self._redact_string(
                            item, hit, path + info[1], found, True if hit is None else None
                        )
                    continue
                if (kind is int and -_SCAN_NUMBERS_FROM < item < _SCAN_NUMBERS_FROM) or item is None or kind is bool:
                    bound += _SIZE_PER_NODE
                    copied[key] = item
                    continue
            copied[key] = self._walk(item, path + info[1], extra, found, size)
        size[0] += bound
        return copied

    def _walk_list(
        self,
        value: list[Any] | tuple[Any, ...],
        path: str,
        extra: frozenset[str] | None,
        found: list[str],
        size: list[int],
    ) -> list[Any]:
        quick = self._quick
        fast = extra is None and self._only_gated
        min_digits = self._min_digits
        keyed = self._key_pattern is not None
        copied: list[Any] = []
        bound = 0
        for index, item in enumerate(value):
            if fast:
                kind = type(item)
                if kind is str:
                    bound += _SIZE_PER_CHAR * len(item) + _SIZE_PER_NODE
                    hit = quick(item)
                    if hit is None and (len(item) < min_digits or _digit_count(item) < min_digits):
                        if keyed and (":" in item or "=" in item):
                            copied.append(self._redact_key_values(item, f"{path}/{index}", found))
                        else:
                            copied.append(item)
                    else:
                        copied.append(
                            self._redact_string(item, hit, f"{path}/{index}", found, True if hit is None else None)
                        )
                    continue
                if (kind is int and -_SCAN_NUMBERS_FROM < item < _SCAN_NUMBERS_FROM) or item is None or kind is bool:
                    bound += _SIZE_PER_NODE
                    copied.append(item)
                    continue
            copied.append(self._walk(item, f"{path}/{index}", extra, found, size))
        size[0] += bound
        return copied

    def _walk(self, value: Any, path: str, extra: frozenset[str] | None, found: list[str], size: list[int]) -> Any:
        if extra is not None and path in extra:
            found.append(path)
            size[0] += _REDACTED_SIZE
            return REDACTED
        kind = type(value)
        if kind is str:
            size[0] += _SIZE_PER_CHAR * len(value) + _SIZE_PER_NODE
            return self._redact_string(value, self._quick(value), path, found)
        size[0] += _SIZE_PER_NODE
        if kind is int:
            if -_SCAN_NUMBERS_FROM < value < _SCAN_NUMBERS_FROM:
                return value
            if value.bit_length() > 64:
                # Far longer than any secret a detector looks for; bound its decimal length without str().
                size[0] += value.bit_length() // 3 + 2
                return value
            # A number is scanned as its decimal text, so a card number sent as an int is caught too.
            text = str(value)
            if self._spans(text, self._quick(text)):
                found.append(path)
                return REDACTED
            return value
        if value is None or kind is bool:
            return value
        if kind is float:
            if not math.isfinite(value):
                return _non_finite(value)
            if -_SCAN_NUMBERS_FROM < value < _SCAN_NUMBERS_FROM:
                return value
            text = repr(value)
            if self._spans(text, self._quick(text)):
                found.append(path)
                return REDACTED
            return value
        if kind is dict or isinstance(value, Mapping):
            return self._walk_mapping(value, path, extra, found, size)
        if isinstance(value, list | tuple):
            return self._walk_list(value, path, extra, found, size)
        return self._walk(_convert(value), path, extra, found, size)


def _compile_keys(secret_keys: Sequence[str]) -> re.Pattern[str] | None:
    if isinstance(secret_keys, str):
        raise TypeError("secret_keys must be a sequence of key words, not one string")
    words = set()
    for key in secret_keys:
        word = _normalize_key(key)
        if not word:
            raise ValueError(f"secret key {key!r} is empty once '-' and '_' are removed; it would match every key")
        words.add(word)
    if not words:
        return None
    return re.compile("|".join(re.escape(word) for word in sorted(words)))


def _compile_paths(
    paths: Mapping[str, Sequence[str]],
) -> tuple[dict[str, frozenset[str] | None], frozenset[str] | None]:
    """Per tool, the pointers to replace ("*" pointers merged in), and the "*" pointers for other tools."""
    parsed: dict[str, frozenset[str]] = {}
    for tool, pointers in paths.items():
        if isinstance(pointers, str):
            raise TypeError(f"paths[{tool!r}] must be a sequence of JSON pointers, not one string")
        for pointer in pointers:
            if not isinstance(pointer, str) or not pointer.startswith("/"):
                raise ValueError(f"paths[{tool!r}]: {pointer!r} is not a JSON pointer (it must start with '/')")
            if _BAD_POINTER_ESCAPE.search(pointer):
                raise ValueError(f"paths[{tool!r}]: {pointer!r} has a '~' not followed by 0 or 1 (RFC 6901)")
        parsed[tool] = frozenset(pointers)
    star = parsed.pop("*", frozenset())
    per_tool = {tool: (pointers | star) or None for tool, pointers in parsed.items()}
    return per_tool, star or None


def _compile_gate(anchored: Sequence[_AnchoredDetector]) -> tuple[re.Pattern[str], dict[str, int]]:
    """The gate pattern of the anchored detectors, and per first character the detectors it fires (a bit mask).

    One alternative per first character, each starting with that literal character: re then compiles
    the gate to a character-set scan and skips every other character in C. The character at a hit
    names its alternative, so no capturing group (which would defeat that scan) is needed to learn
    which detectors to run. Each alternative costs every candidate character a check, so anchors
    share characters where they can.
    """
    tails: dict[str, list[str]] = {}
    fire: dict[str, int] = {}
    for index, detector in enumerate(anchored):
        for char, tail in detector.anchors:
            if len(char) != 1:
                raise ValueError(f"detector {detector.name!r}: anchor {char!r} is not a single character")
            known = tails.setdefault(char, [])
            if tail not in known:
                known.append(tail)
            fire[char] = fire.get(char, 0) | 1 << index
    if not tails:
        return _NEVER_MATCHES, fire
    alternatives = [f"{re.escape(char)}(?:{'|'.join(tails[char])})" for char in sorted(tails)]
    return re.compile("|".join(alternatives), re.ASCII), fire
