"""Does a value hold a secret? `has_secrets` answers; `NoSecrets` denies calls whose arguments do.

The secrets are the ones the audit trail's `Redactor` (events.redaction) knows, found by the same
content detectors and the same secret-key rule, but looked for harder, since a model that wants a
secret out will write it so that a plain scan misses it:

* each string is normalized first: compatibility forms folded (NFKD: full-width and mathematical
  letters and digits become ASCII, and so do the digits of other scripts), invisible characters
  dropped (format characters such as zero-width spaces and joiners, controls, combining marks,
  private-use and unassigned code points), Cyrillic and Greek look-alikes of Latin letters mapped
  to them, and the separators of a run of digit groups ("4111.1111.1111.1111", "4111 / 1111 /
  ...") written as single spaces;
* what is encoded inside it is decoded and scanned in turn, up to three layers deep: base64
  (standard and URL-safe, padded or not, at any alignment, across lines), base32, hex (plain,
  "\\x41", "0x41", "41:4b"), quoted-printable, percent-encoding, HTML character references and
  backslash escapes, and gzip or zlib data inside any of them;
* a key written in groups or over lines ("AKIA IOSF ODNN 7EXA MPLE") is read with the blanks
  between its groups removed;
* a value written after a key name such as `password=`, `pwd:`, `api_key=` or `token:` is a
  secret when it looks like a credential (not a placeholder, a variable, a plain word or a type);
* the string values of a whole call are also scanned joined together (with "" and with " ", and
  joined backwards), so a key split across list items or fields is found.

A string holding NUL or a lone surrogate counts as a secret: the policy engine cannot hold such a
string whole, so both routes refuse it.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import functools
import html
import re
import string
import unicodedata
import urllib.parse
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from events.redaction import REDACTED, Redactor
from interceptor_core.builtins._config import check_identity, field_names, tool_matcher
from interceptor_core.context import ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

__all__ = ["NoSecrets", "has_secrets"]

LAYERS = 3
"""How many layers of encoding (base64 inside hex inside percent-encoding, ...) are looked through."""

_BUDGET_FLOOR = 1 << 16
_BUDGET_PER_CHAR = 8
# Decoded text scanned per call, at most: the floor plus this many characters per character of
# input. Each layer of decoding yields a few times its input at most (four base64 alignments, two
# hex ones, the other decodings), so honest values stay far below it; past it the value is judged
# as one that cannot be looked at whole.

_SHORTEST_NUMBER = 10_000_000

_SHORTEST_SECRET = 8
# Fewer characters hold no secret any detector or credential rule finds (a card has 13 digits, a
# credential after a key name 6 characters past "pw=").

_PASSWORD_WORDS = ("pwd", "pw", "pass", "psw")
# Key names the redactor deliberately leaves alone ("pwd" is a shell's working directory), taken
# here only when the value after them looks like a credential.


def has_secrets(value: Any, *, redactor: Redactor | None = None) -> bool:
    """True when `value` holds a secret that `redactor` (default: a shared `Redactor()`) knows, however written.

    Looked at: every string, every mapping key (as text), every number as its decimal text (a card
    number sent as an int), bytes decoded as UTF-8, and what a pydantic model, a dataclass, a set or
    any other object holds (its fields, its items, else its `str()`), at any depth. Each string is
    normalized and decoded as the module says, then scanned with the redactor's content detectors
    (API keys and tokens, JWTs, private key blocks, Luhn-valid card numbers, credentials in URLs,
    ...); a match that is only words or a placeholder ("Bearer TOKEN", "bearer auth",
    "Authorization: Bearer <token>", `$TOKEN`) is prose about a secret, not one.

    A mapping key that the redactor's secret-key rule marks (`password`, `api_key`, `Authorization`,
    ...: see `events.redaction.DEFAULT_SECRET_KEYS`) makes its value a secret when that value holds
    anything: a non-blank string (or bytes), or a number, itself or anywhere inside; under a key
    named like `pwd` or `pass`, a value is a secret when it looks like a credential. The rule also
    matches counters such as `max_tokens`; build the redactor with `secret_keys=` to narrow it. In
    text, a value after a secret key name and ":" or "=" is a secret only when it looks like a
    credential ("password: hunter2" is, "Password: must be 12 characters" is not), so this check
    finds less there than the redactor replaces.

    The string values (and bytes) are also scanned joined in one text, mapping entries taken in the
    order of their keys and list items in order: forwards with "" and with " " between them, and
    backwards with "". A run of digits found only across two values is not taken for a card (two
    numeric ids side by side often pass the Luhn check); numbers are not joined.

    A string (or mapping key) holding NUL or a lone surrogate is a secret: what it hides cannot be
    judged the same way by every reader. The redactor's per-tool `paths` are not used (this check
    does not know a tool); a disabled redactor finds nothing else.

    Never raises: a value that cannot be looked at whole (a detector that fails, an object whose
    `str()` raises, decodings past the size bound) counts as holding a secret. No I/O; the default
    redactor's detectors are built on first use (about a tenth of a second, once). Safe from
    several threads.
    """
    chosen = _default_redactor() if redactor is None else redactor
    try:
        scan = _Scan(chosen)
        strings: list[str] = []
        return scan.holds_secret(value, strings) or scan.joined_holds_secret(strings)
    except Exception:
        return True  # fail closed: what could not be scanned may hold anything


class NoSecrets:
    """Denies a call whose arguments hold a secret (see `has_secrets`), without repeating it.

    `fields` names the arguments to look at (None: all of them); an argument the tool does not have
    is skipped. Each argument is judged with its name, so the secret-key rule applies to argument
    names too: a non-empty `password` argument is a secret. The string values of the arguments
    looked at are also judged joined together, as `has_secrets` joins those of one value, so a key
    split across two arguments is found; the denial then names them all. `tools` restricts the check
    to the tools matching one of its globs (`fnmatch.fnmatchcase`; None: every tool). `redactor`
    defaults to a shared `Redactor()`; give the gate's own to stay in step with the audit trail. The
    denial names the tool and the arguments holding secrets, never their values.

    Sync, no I/O; safe from several threads. `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        *,
        tools: str | Sequence[str] | None = None,
        fields: str | Sequence[str] | None = None,
        name: str = "no-secrets",
        mandatory: bool = False,
        redactor: Redactor | None = None,
    ) -> None:
        self.name = check_identity(name, mandatory)
        self.mandatory = mandatory
        self.fields = None if fields is None else field_names(fields, interceptor=name)
        if redactor is not None and not isinstance(redactor, Redactor):
            raise ConfigurationError(f"redactor must be an events.Redactor, got {redactor!r}", interceptor=name)
        self.redactor = _default_redactor() if redactor is None else redactor
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a looked-at argument, or their strings joined, hold a secret; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        args = call.args
        fields = list(args.keys()) if self.fields is None else [field for field in self.fields if field in args]
        found: list[str] = []
        together = False
        try:
            scan = _Scan(self.redactor)
            strings: dict[str, list[str]] = {}
            for field in fields:
                texts = strings[field] = []
                if scan.holds_secret({field: args[field]}, texts):
                    found.append(field)
            if not found:
                # In key order, as has_secrets joins the strings of the arguments as one mapping.
                joined = [text for field in sorted(strings) for text in strings[field]]
                together = scan.joined_holds_secret(joined)
        except Exception:
            found = list(fields)  # fail closed, as has_secrets does
        if together:
            found = [field for field in fields if any(strings[field])]
        if not found:
            return None
        which = ", ".join(map(repr, found))
        what = "hold, joined together," if together else ("holds" if len(found) == 1 else "hold")
        return Deny(
            f"{tool}: {'argument' if len(found) == 1 else 'arguments'} {which} {what} what looks like a "
            "secret (a key, token, password, private key or card number, perhaps encoded or split), and this "
            "tool may not be sent secrets. Call it again without the secret; do not repeat it."
        )

    def __repr__(self) -> str:
        return f"NoSecrets(fields={self.fields!r}, name={self.name!r})"


@functools.cache
def _default_redactor() -> Redactor:
    return Redactor()


@functools.cache
def _password_words() -> Redactor:
    return Redactor(detectors=[], secret_keys=_PASSWORD_WORDS)


class _TooMuch(Exception):
    """The decodings of one value outgrew the bound: judged as a value that cannot be looked at whole."""


class _Scan:
    """One judgement: the redactor, and what is left of the decoding budget."""

    __slots__ = ("budget", "passwords", "redactor")

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.passwords = _password_words() if redactor.enabled else None
        self.budget = _BUDGET_FLOOR

    def holds_secret(self, value: Any, strings: list[str]) -> bool:
        """Does `value` hold a secret? Its string values are appended to `strings`, in joining order."""
        redactor = self.redactor
        # A stack rather than recursion: a value nested deeper than the recursion limit is still
        # scanned. Children are pushed reversed, so they are met in order.
        pending: list[Any] = [value]
        # Containers met before (a cycle, or shared), kept alive so that a fresh model_dump() dict
        # cannot take the id of one already freed and be skipped.
        seen: dict[int, Any] = {}
        while pending:
            item = pending.pop()
            if isinstance(item, _Entry):
                key = item.key
                if self.text_holds_secret(key):
                    return True
                key = _normalize(key)  # a full-width or Cyrillic "pаssword" is still the key name
                if redactor.is_secret_key(key) and _holds_anything(item.value):
                    return True
                if (
                    self.passwords is not None
                    and self.passwords.is_secret_key(key)
                    and isinstance(item.value, str | int)
                    and not isinstance(item.value, bool)
                    and _looks_like_credential(str(item.value))
                ):
                    return True
                pending.append(item.value)
            elif isinstance(item, str):
                strings.append(item)
                if self.text_holds_secret(item):
                    return True
            elif item is None or isinstance(item, bool):
                continue
            elif isinstance(item, int):
                # As the redactor does: no detector matches fewer than 8 digits, and past 64 bits a
                # number is longer than any secret a detector looks for.
                if abs(item) >= _SHORTEST_NUMBER and item.bit_length() <= 64 and self.text_holds_secret(str(int(item))):
                    return True
            elif isinstance(item, float):
                if self.text_holds_secret(repr(item)):
                    return True
            elif isinstance(item, bytes | bytearray | memoryview):
                text = _bytes_text(bytes(item))
                strings.append(text)
                if self.text_holds_secret(text, raw=False):
                    return True
            elif id(item) in seen:
                continue
            elif isinstance(item, Mapping):
                seen[id(item)] = item
                entries = sorted((_Entry(_key_text(key), inner) for key, inner in item.items()), key=_entry_key)
                pending.extend(reversed(entries))
            else:
                seen[id(item)] = item
                pending.extend(reversed(_contents(item)))
        return False

    def joined_holds_secret(self, strings: list[str]) -> bool:
        """Do `strings`, joined together, hold a secret none of them holds alone?"""
        if len(strings) < 2:
            return False
        # Joined with " ", what a run of base64 or hex would cross is a blank: no decoding then; and
        # read without blanks, its groups are those of the text joined with "".
        for pieces, separator in ((strings, ""), (strings, " "), (strings[::-1], "")):
            junctions: list[int] = []
            at = 0
            for piece in pieces[:-1]:
                at += len(piece)
                junctions.append(at)
                at += len(separator)
            if self.text_holds_secret(separator.join(pieces), junctions=junctions, decode=not separator):
                return True
        return False

    def text_holds_secret(
        self, text: str, *, raw: bool = True, junctions: list[int] | None = None, decode: bool = True, depth: int = 0
    ) -> bool:
        """Does `text` hold a secret, once normalized, or in what it encodes?

        `raw`: the text is one the model wrote (NUL or a lone surrogate then make it a secret);
        otherwise it was decoded, and such characters are dropped like other invisible ones.
        `junctions`: the text joins several values, each already judged alone, and these are the
        offsets where one ends; a span of digits alone is then no secret, and only the encoded runs
        that cross a junction are decoded again. `decode=False` skips the decodings and the reading
        of blank-separated groups (for the text joined with blanks: its groups are the other's).
        """
        if raw and _UNREADABLE.search(text) is not None:
            return True
        if len(text) < _SHORTEST_SECRET:
            return False
        if depth == 0:
            self.budget += _BUDGET_PER_CHAR * len(text)
        redactor = self.redactor
        across = junctions is not None
        plain = _normalize(text)
        if across and (len(plain) != len(text) or not text.isascii()):
            junctions = None  # normalization moved the offsets: decode every run again
        # Across values a run of digits is no card (see has_secrets): the card detector is skipped.
        for view in (plain, None if across else _spaced_digit_groups(plain)):
            if view is None:
                continue
            for start, end in redactor.detector_spans(view, digits=not across):
                if across and _DIGITS_ONLY.fullmatch(view, start, end) is not None:
                    continue
                if not _is_placeholder(view[start:end]):
                    return True
        if (
            decode
            and len(plain) >= 16
            and _BLANKS.search(plain) is not None
            and _digit_total(plain)
            and _grouped_secret(plain, redactor)
        ):
            return True
        passwords = self.passwords
        if passwords is not None and ("=" in plain or ":" in plain) and _assigns_credential(plain, redactor, passwords):
            return True
        if decode and depth < LAYERS and redactor.enabled:
            for decoded in _decodings(plain, junctions):
                self.budget -= len(decoded)
                if self.budget < 0:
                    raise _TooMuch
                if self.text_holds_secret(decoded, raw=False, depth=depth + 1):
                    return True
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    """A mapping entry met in a walk: its key (as text) is judged, then its value."""

    key: str
    value: Any


def _entry_key(entry: _Entry) -> str:
    return entry.key


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else str(key)


def _contents(item: Any) -> list[Any]:
    """What a value that is not a str, number, bytes or mapping holds, to be looked at in turn."""
    if isinstance(item, list | tuple):
        return list(item)
    if isinstance(item, set | frozenset):
        # In a fixed order, so that the joined strings do not depend on hashing.
        return sorted(item, key=repr)
    if isinstance(item, BaseModel):
        return [item.model_dump()]
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return [{field.name: getattr(item, field.name) for field in dataclasses.fields(item)}]
    return [str(item)]


def _holds_anything(value: Any) -> bool:
    """Does `value` hold what a secret could be: a non-blank string or bytes, or a number, at any depth?"""
    pending: list[Any] = [value]
    seen: dict[int, Any] = {}
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if item.strip():
                return True
        elif isinstance(item, bytes | bytearray | memoryview):
            if bytes(item).strip():
                return True
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int | float):
            return True
        elif id(item) in seen:
            continue
        elif isinstance(item, Mapping):
            seen[id(item)] = item
            pending.extend(item.values())
        else:
            seen[id(item)] = item
            pending.extend(_contents(item))
    return False


# --- normalization ---------------------------------------------------------------------------

_UNREADABLE = re.compile("[\x00\ud800-\udfff]")
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_DROPPED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Mn", "Me"})
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Drawn as nothing, yet letters or symbols rather than format characters: the Hangul fillers
# (Unicode lists them as default-ignorable) and the blank Braille pattern.
_KEPT = frozenset("\t\n\r")

_LOOK_ALIKES: dict[int, str | None] = {
    ord(char): latin
    for chars, latins in (
        # Cyrillic
        ("АВЕКМНОРСТХУЅІЈԁаеорсухѕіјһԛԝӏ", "ABEKMHOPCTXYSIJdaeopcyxsijhqwl"),
        # Greek
        ("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧονικρ", "ABEZHIKMNOPTYXovikp"),
        # Latin small capitals
        ("ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ", "ABCDEFGHIJKLMNOPRSTUVWYZ"),
        # regional indicators, negative circled and negative squared letters
        ("".join(map(chr, range(0x1F1E6, 0x1F200))), string.ascii_uppercase),
        ("".join(map(chr, range(0x1F150, 0x1F16A))), string.ascii_uppercase),
        ("".join(map(chr, range(0x1F170, 0x1F18A))), string.ascii_uppercase),
    )
    for char, latin in zip(chars, latins, strict=True)
}
# Not Unicode's whole confusables table: the letters that pass for Latin ones in the alphabets a
# key or token is written in, and letters drawn as symbols that NFKD does not fold. NFKD already
# folds full-width, mathematical, circled and other compatibility forms.

_DIGIT_RUN = re.compile(r"[0-9](?<![0-9][0-9])(?=(?:[ \t._/\\-]{0,3}[0-9]){12})[0-9]*(?:[ \t._/\\-]{1,3}[0-9]+)+")
# A run of digit groups holding 13 digits or more (fewer make no card, however spaced).
_DIGIT_SEPARATOR = re.compile(r"[ \t._/\\-]{1,3}")
_DIGITS_ONLY = re.compile(r"[0-9 \t._/\\-]+")


def _normalize(text: str) -> str:
    """`text` as a detector should see it: folded, invisible characters dropped, look-alikes mapped."""
    if text.isascii():
        if _ASCII_CONTROL.search(text) is not None:
            text = _ASCII_CONTROL.sub("", text)
    else:
        text = unicodedata.normalize("NFKD", text)
        table: dict[int, str | None] = dict(_LOOK_ALIKES)
        for char in set(text):
            if char > "\x7f":
                kind = unicodedata.category(char)
                if kind in _DROPPED or char in _BLANK_LETTERS:
                    table[ord(char)] = None
                elif kind == "Pd" or char == "\u2212":
                    table[ord(char)] = "-"  # Unicode hyphens, dashes and the minus sign, between card digits
                elif kind == "Nd":
                    table[ord(char)] = str(unicodedata.decimal(char))  # Arabic-Indic, Devanagari, ... digits
            elif char not in _KEPT and (char < " " or char == "\x7f"):
                table[ord(char)] = None
        text = text.translate(table)
    return text


_BLANKS = re.compile(r"\s")
_WORD = r"[\"'(\[]*(?:[a-z]{3,}|[A-Z][a-z]{2,})[\"')\].,;:!?]*(?!\S)"
_NOT_WORD = rf"(?!{_WORD})\S+"
_GROUPS = re.compile(rf"(?<!\S)(?:{_NOT_WORD}\s+)+{_NOT_WORD}")
_LETTER_AND_DIGIT = re.compile(r"(?=[^0-9]*[0-9])(?=[^A-Za-z]*[A-Za-z][^A-Za-z]*[A-Za-z]).*", re.DOTALL)


def _grouped_secret(text: str, redactor: Redactor) -> bool:
    """Does `text` hold a key written in groups ("AKIA IOSF ODNN 7EXA MPLE") or over lines?

    The detectors read each run of blank-separated groups with its blanks removed. Gluing words
    together makes text they can mistake for a token ("they Jumped over the fence. It was 2026"
    reads as a JWT), so a run stops at a word (three lower-case letters or more, or a capitalized
    word, punctuation around it allowed), and a match counts only when it spans several groups and
    holds a digit and two letters: a card's digits are read in the text itself. Capitals and digits
    glued across blanks ("ASIA PAC 2026 Q4 UPDATE") can still read as an AWS key id.
    """
    if not redactor.may_match("".join(text.split())):
        return False  # a match in one run's groups would show an anchor in all of them glued
    for run in _GROUPS.finditer(text):
        groups = run.group().split()
        compact = "".join(groups)
        if len(compact) < 16:
            continue
        starts: list[int] = []
        at = 0
        for group in groups:
            starts.append(at)
            at += len(group)
        for start, end in redactor.detector_spans(compact, digits=False):
            crosses = bisect.bisect_right(starts, start) < bisect.bisect_left(starts, end)
            if crosses and _LETTER_AND_DIGIT.fullmatch(compact, start, end) is not None:
                return True
    return False


def _spaced_digit_groups(text: str) -> str | None:
    """`text` with the separators of its runs of digit groups as single spaces, as the card detector
    reads them ("4111.1111.1111.1111" -> "4111 1111 1111 1111"); None when that changes nothing.

    A view beside the text, not in its place: the dashes between digits belong to some tokens.
    """
    if _digit_total(text) < 13:
        return None
    spaced = _DIGIT_RUN.sub(_space_groups, text)
    return None if spaced == text else spaced


def _digit_total(text: str) -> int:
    codes = text.encode("ascii", "ignore")
    return len(codes) - len(codes.translate(None, b"0123456789"))


def _space_groups(match: re.Match[str]) -> str:
    """A run of digit groups with its separators as single spaces, when that may make it a card.

    Only when every separator is the same, or the run holds at most the 19 digits of a card: a
    list of dotted addresses ("10.0.0.1 10.0.0.2") must not become one long run of groups.
    """
    run = match.group()
    separators = set(_DIGIT_SEPARATOR.findall(run))
    if len(separators) == 1 or _digit_total(run) <= 19:
        return _DIGIT_SEPARATOR.sub(" ", run)
    return run


_PLACEHOLDER_WORD = re.compile(
    r"[`'\"<({\[]*"
    r"(?:[a-z]{1,12}|[A-Z]{1,12}|[A-Z][a-z]{1,11}|[A-Za-z]*_[A-Za-z_]{1,23}|\$\{?[A-Za-z_]+\}?|\.{3}|\*+"
    # A challenge's parameters (`WWW-Authenticate: Bearer realm="api", scope="read"`, RFC 6750) name
    # no credential.
    r"|(?:realm|scope|error|error_description|error_uri|resource_metadata)=\"[^\"]*\")"
    r"[`'\">)}\].,;:!?=]*"
)


def _is_placeholder(span: str) -> bool:
    """Is what a detector matched only words ("Bearer TOKEN with a token", "bearer auth", "<token>")?

    Prose about credentials ("the proxy reads a bearer token"), and examples that name one without
    giving it, match the detectors of "Bearer ...", "Authorization: ..." and URL credentials. No key
    or token is a word of twelve letters or fewer in one case (or capitalized), a name with "_"
    (`API_KEY`), a variable (`$TOKEN`) or "..." or "***", nor a challenge's `realm="..."`.
    """
    words = span.split()
    return bool(words) and all(_PLACEHOLDER_WORD.fullmatch(word) is not None for word in words)


# --- decodings -------------------------------------------------------------------------------

_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_BASE64_BLOCK = re.compile(
    r"(?m)^[ \t]*[A-Za-z0-9+/_-]+={0,2}[ \t]*\r?\n(?:[ \t]*[A-Za-z0-9+/_-]+={0,2}[ \t]*(?:\r?\n|\Z))+"
)
# Lines of any width: base64 wrapped at 8 characters (or 1) is still one run across its lines.
_URLSAFE = str.maketrans("-_", "+/")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{16,}")
_HEX_GROUPS = (
    ("\\x", re.compile(r"(?:\\x[0-9A-Fa-f]{2}){8,}")),
    ("0x", re.compile(r"(?:0x[0-9A-Fa-f]{2}[ \t,;]*){8,}")),
    ("", re.compile(r"[0-9A-Fa-f]{2}(?:[ :-][0-9A-Fa-f]{2}){7,}")),
)
# One pattern each, so that re can skip to its first character: an alternation of them cannot.
_BASE32_RUN = re.compile(r"[A-Z2-7]{16,}=*")
_QUOTED_PRINTABLE = re.compile(r"(?:=[0-9A-F]{2}){8,}")
_NOT_HEX = re.compile(r"\\x|0x|[^0-9A-Fa-f]")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_ENTITY = re.compile(r"&(?:#[0-9]+;?|#[xX][0-9A-Fa-f]+;?|[A-Za-z][A-Za-z0-9]*;)")
_ESCAPE = re.compile(r"\\(?:u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|x[0-9A-Fa-f]{2}|[0-7]{3})")
_DECOMPRESSED_LIMIT = 1 << 20


def _decodings(text: str, junctions: list[int] | None = None) -> Iterator[str]:
    """What `text` may encode: each candidate decoded, as text.

    With `junctions`, only the base64, base32 and hex runs that cross one of these offsets.
    """
    for match in _BASE64_RUN.finditer(text):
        if junctions is not None and not _crosses(match, junctions):
            continue
        for hex_run in _HEX_RUN.findall(match.group()):  # hex digits are base64 letters: within a run
            for offset in (0, 1):
                digits = hex_run[offset:]
                yield from _as_texts(bytes.fromhex(digits[: len(digits) // 2 * 2]))
        run = match.group().rstrip("=").translate(_URLSAFE)
        # At each of the four alignments, since the encoded secret may follow a few characters glued
        # to it; but when the run reads as text from its start, it is that text, at that alignment.
        for offset in range(4):
            data = _from_base64(run[offset:])
            if data is None:
                break
            yield from _as_texts(data)
            if offset == 0 and _is_text(data):
                break
    if "\n" in text:
        for match in _BASE64_BLOCK.finditer(text):
            data = _from_base64("".join(match.group().split()).rstrip("=").translate(_URLSAFE))
            if data is not None:
                yield from _as_texts(data)

    for marker, pattern in _HEX_GROUPS:
        if marker not in text:
            continue
        for match in pattern.finditer(text):
            if junctions is not None and not _crosses(match, junctions):
                continue
            digits = _NOT_HEX.sub("", match.group())
            yield from _as_texts(bytes.fromhex(digits[: len(digits) // 2 * 2]))
    for match in _BASE32_RUN.finditer(text):
        if junctions is not None and not _crosses(match, junctions):
            continue
        data = _from_base32(match.group())
        if data is not None:
            yield from _as_texts(data)
    if "=" in text:
        for match in _QUOTED_PRINTABLE.finditer(text):
            yield from _as_texts(bytes.fromhex(match.group().replace("=", "")))
    if "%" in text and _PERCENT.search(text) is not None:
        yield from _as_texts(urllib.parse.unquote_to_bytes(text))
    if "&" in text and _ENTITY.search(text) is not None:
        unescaped = html.unescape(text)
        if unescaped != text:
            yield unescaped
    if "\\" in text and _ESCAPE.search(text) is not None:
        yield _ESCAPE.sub(_unescape, text)


def _crosses(match: re.Match[str], junctions: list[int]) -> bool:
    start, end = match.span()
    at = bisect.bisect_right(junctions, start)
    return at < len(junctions) and junctions[at] < end


def _from_base64(run: str) -> bytes | None:
    """The bytes of `run` (the standard alphabet, no padding), or None when it is too short."""
    usable = len(run) - len(run) % 4 if len(run) % 4 == 1 else len(run)
    if usable < 12:
        return None
    chunk = run[:usable]
    try:
        return binascii.a2b_base64(chunk + "=" * (-len(chunk) % 4))
    except binascii.Error:
        return None


def _is_text(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.isprintable() or all(char.isprintable() or char.isspace() for char in text)


def _from_base32(run: str) -> bytes | None:
    """The bytes of a base32 run (RFC 4648), or None when it does not decode."""
    letters = run.rstrip("=")
    letters = letters[: len(letters) - len(letters) % 8] if len(letters) % 8 in (1, 3, 6) else letters
    try:
        return base64.b32decode(letters + "=" * (-len(letters) % 8))
    except (binascii.Error, ValueError):
        return None


def _as_texts(data: bytes) -> Iterator[str]:
    """Decoded bytes as text, and the text of what they hold when they are gzip or zlib data.

    Bytes with no run of 8 printable characters (single blanks allowed between them) are skipped:
    no secret is that short.
    """
    text = _bytes_text(data)
    if _WORTH_SCANNING.search(text) is not None:
        yield text
    if data[:2] == b"\x1f\x8b" or (len(data) > 1 and data[0] & 0x0F == 8 and int.from_bytes(data[:2]) % 31 == 0):
        inflater = zlib.decompressobj(wbits=47)  # gzip or zlib, told apart by the header
        try:
            inflated = inflater.decompress(data, _DECOMPRESSED_LIMIT)
        except zlib.error:
            return
        if inflater.unconsumed_tail:
            raise _TooMuch
        yield _bytes_text(inflated)


def _bytes_text(data: bytes) -> str:
    """Decoded bytes as text: UTF-8 when they are; else their printable ASCII, NULs dropped (UTF-16
    text), other bytes as blanks, so the ASCII of a secret stays readable whatever surrounds it."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.translate(_BINARY, b"\x00").decode("ascii")


_WORTH_SCANNING = re.compile(r"[^\s\ufffd](?:[ ]?[^\s\ufffd]){7}")
_BINARY = bytes(byte if 32 <= byte < 127 or byte in b"\t\n\r" else 32 for byte in range(256))


def _unescape(match: re.Match[str]) -> str:
    escape = match.group()
    code = int(escape[2:], 16) if escape[1] in "uUx" else int(escape[1:], 8)
    return chr(code) if code <= 0x10FFFF else ""


# --- credentials after key names -------------------------------------------------------------


_PASSWORD_HINT = re.compile(r"(?i)p(?:a?s|w)")


def _assigns_credential(text: str, redactor: Redactor, passwords: Redactor) -> bool:
    """Is a value that looks like a credential written after a secret key name (or `pwd`, `pass`) in `text`?"""
    finders = (redactor, passwords) if _PASSWORD_HINT.search(text) is not None else (redactor,)
    for finder in finders:
        for start, end in finder.key_value_spans(text):
            if _looks_like_credential(text[start:end]):
                return True
    return False


_EXPRESSION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:[(\[].*)?")
_NOT_SYMBOL = frozenset("_-./:\\")


def _looks_like_credential(value: str) -> bool:
    """Could `value`, written after a secret key name, be a password, key or token?

    Not when it is short (under 6 characters), holds a blank, is a placeholder or a reference
    (`$TOKEN`, `${...}`, `<your token>`, `{{...}}`, `[REDACTED]`, `***`, `...`), a plain word or
    identifier (`required`, `SecretStr`, `AccessDeniedError`, `None`), a dotted name or a call
    (`os.environ['X']`, `settings.API_KEY`), or a URL. Yes when it mixes letters with digits or
    symbols, or digits with symbols, or is six digits or more.
    """
    value = value.strip().strip("\"'`").rstrip(".,;:)]}>")
    if not 6 <= len(value) <= 4096 or any(char.isspace() for char in value):
        return False
    if value[0] in "$%{<[(@*#&!" or REDACTED in value or "://" in value or len(set(value)) <= 2:
        return False
    if _EXPRESSION.fullmatch(value) is not None and ("." in value or "(" in value or "[" in value):
        return False
    if value.isdigit():
        return True
    letters = any(char.isalpha() for char in value)
    digits = any(char.isdigit() for char in value)
    symbols = any(not char.isalnum() and char not in _NOT_SYMBOL for char in value)
    return (letters and (digits or symbols)) or (digits and symbols)
