"""Is a URL's host on an allow-list? `host_in` answers; `HostAllowList` denies calls that leave it.

The check decides on the host an HTTP client will connect to, and it only decides on URLs that
every client reads alike. HTTP clients and URL parsers disagree on many spellings (httpx and
`urllib.parse` read `https://a.example\\@b.example/` as b.example, urllib3 and browsers as
a.example; `http://0x7f.1/` is a name to some and 127.0.0.1 to the resolver), so a URL is read
only in its plain form, and anything else is refused with what to write instead:

    scheme://host[:port][/path][?query][#fragment]

- the scheme is http, https, ws or wss (any case), followed by exactly two slashes;
- no userinfo: an `@` before the host ends is refused (credentials belong in the tool's own
  configuration, never in a URL the model writes);
- the host is ASCII: a name of letters, digits, `-` and `_` in dot-separated labels (1 to 63
  characters each, 253 in all; an `xn--` label must be the exact A-label of a valid IDNA name), a
  canonical IPv4 address (four decimal numbers 0 to 255 without leading zeros), or an IPv6 literal
  in brackets without a zone id. No percent-escapes, no trailing dot, no Unicode or full-width
  letters and dots (an internationalized name is written as its `xn--` A-label), no IPv4 in octal,
  hexadecimal, integer or shortened form, and no name whose last label is a number;
- the port, when there is a `:`, is one to five ASCII digits up to 65535;
- nowhere in the URL a backslash, a control, format, space or separator character, a surrogate or
  an unassigned or private-use code point (a NUL byte included); other non-ASCII characters may
  appear in the path, query and fragment;
- at most 65536 characters (httpx's limit).

Case does not matter (`DOCS.Example` is docs.example); ports are ignored. A URL of another form,
another scheme (`file:`, `mailto:`, `ftp:`, `javascript:`), a relative URL or a scheme-relative
`//host/` names no host that can be checked, and is never allowed.
"""

from __future__ import annotations

import encodings.idna
import functools
import ipaddress
import re
import unicodedata
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from interceptor_core.builtins._config import check_identity, field_names, field_values, tool_matcher
from interceptor_core.context import ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

__all__ = ["HostAllowList", "host_in"]

_Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
_Host: TypeAlias = str | _Address

_MAX_URL_CHARS = 65536
"""The longest URL read; httpx refuses longer ones."""

_SCHEMES_WITH_HOSTS = frozenset({"http", "https", "ws", "wss"})
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_END_OF_AUTHORITY = re.compile(r"[/?#]")
_ASCII_REFUSED = re.compile(r"[\x00-\x20\x7f\\]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
"""Controls, format characters (zero-width, bidi), surrogates, private-use and unassigned code
points, spaces and separators: characters clients strip, reject, encode or read differently."""
_PORT = re.compile(r"[0-9]{1,5}")
_LABEL = re.compile(r"[a-z0-9_\-]{1,63}")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
"""A last label that makes WHATWG parsers and `inet_aton` (so `getaddrinfo`) read a host as IPv4."""
_DOTTED_QUAD = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
)
_MAX_NAME_CHARS = 253

# Allow-list entries are the policy author's, and read more leniently than URLs: Unicode names
# (compared as A-labels) and IPv4 shorthand are accepted there.
_FORBIDDEN_IN_DOMAIN = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")
# WHATWG's forbidden domain code points.
_IDNA_DEVIATIONS = re.compile("[\u00df\u03c2\u200c\u200d]")
_IPV4_PART = {
    10: re.compile(r"[0-9]+"),
    16: re.compile(r"[0-9a-fA-F]*"),
    8: re.compile(r"[0-7]*"),
}
_HEX_LABEL = re.compile(r"0[xX][0-9a-fA-F]*")


def host_in(url: Any, hosts: str | Sequence[str]) -> bool:
    """True when `url` is a plain http, https, ws or wss URL whose host is on the `hosts` allow-list.

    A URL is read only in the plain form this module's docstring describes; any other is False,
    whatever its host, because HTTP clients would not all agree on where it goes. An entry of
    `hosts` is a host name, matched exactly after normalization (case, IDNA, one trailing dot);
    `*.example.com`, which matches every proper subdomain of example.com (`a.example.com`,
    `a.b.example.com`) but neither example.com itself nor badexample.com; an IPv4 address (in any
    form `inet_aton` reads: `127.1` is 127.0.0.1); or an IPv6 address, bracketed or not. Ports are
    ignored: an entry allows every port.

    Never raises for `url`, which is the model's: anything that is not such a URL is False. Raises
    `TypeError` or `ValueError` for a bad `hosts` (not a str or a sequence of str, no entries, an
    entry that is a URL, holds a port or path, or is not a valid host). Does no I/O (no DNS): a name
    that resolves to an address is not compared with the address. An allow-list is compiled once
    and remembered (for the 256 most recent lists).
    """
    allowed = _allow_list(_entries(hosts))
    host = _url_host(url)
    return not isinstance(host, _Refused) and allowed.admits(host)


class HostAllowList:
    """Denies a call whose URL arguments point at a host that is not on the allow-list (see `host_in`).

    `fields` names the arguments holding URLs (one name or several); an argument the tool does not
    have is skipped, and so is one whose value is None. A list or tuple value is checked URL by URL.
    `tools` restricts the check to the tools matching one of its globs (`fnmatch.fnmatchcase`;
    None: every tool). The denial names the tool, the argument, the host it saw or what makes the
    URL unreadable and what to write instead (never the rest of the URL, which may carry
    credentials), and the allowed hosts.

    Sync, no I/O; safe from several threads. `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        fields: str | Sequence[str],
        hosts: str | Sequence[str],
        *,
        tools: str | Sequence[str] | None = None,
        name: str = "host-allow-list",
        mandatory: bool = False,
    ) -> None:
        self.name = check_identity(name, mandatory)
        self.mandatory = mandatory
        self.fields = field_names(fields, interceptor=name)
        try:
            self.hosts = _entries(hosts)
            self._allowed = _allow_list(self.hosts)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc), interceptor=name) from None
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a named argument's URL has no allowed host; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        for field, value in field_values(call.args, self.fields):
            host = _url_host(value)
            if isinstance(host, _Refused):
                return Deny(
                    f"{tool}: argument {field!r} {host.reason}. The hosts this tool may reach: {', '.join(self.hosts)}."
                )
            if not self._allowed.admits(host):
                return Deny(
                    f"{tool}: argument {field!r} points at host {_display(host)!r}, which this tool may not "
                    f"reach. Allowed hosts: {', '.join(self.hosts)}."
                )
        return None

    def __repr__(self) -> str:
        return f"HostAllowList({self.fields!r}, {self.hosts!r}, name={self.name!r})"


@dataclass(frozen=True, slots=True)
class _Refused:
    """A URL read no further: `reason` completes "argument 'url' ..." and says what to write instead."""

    reason: str


_PLAIN = "write it as scheme://host[:port]/path with scheme http, https, ws or wss"


def _url_host(url: object) -> _Host | _Refused:
    """The host of a plain http(s) or ws(s) URL, normalized; why not, if `url` is no such URL."""
    if not isinstance(url, str):
        return _Refused(f"is {type(url).__name__}, not a URL: send the URL as a string")
    if len(url) > _MAX_URL_CHARS:
        return _Refused(f"is longer than {_MAX_URL_CHARS} characters: send a shorter URL")
    character = _refused_character(url)
    if character == "\\":
        return _Refused(
            "holds a backslash, which some clients read as '/' and others as part of the host: write '/' "
            "before the path, and a backslash inside the path or query as %5C"
        )
    if character is not None:
        return _Refused(
            f"holds the character U+{ord(character):04X} ({_character_name(character)}), which clients strip, "
            "reject or read differently: remove it, and write a space inside the path or query as %20"
        )
    scheme = _SCHEME.match(url)
    if scheme is None:
        return _Refused(f"is not a full URL: {_PLAIN}")
    if scheme.group(1).lower() not in _SCHEMES_WITH_HOSTS:
        return _Refused(f"is not an http, https, ws or wss URL: {_PLAIN}")
    rest = url[scheme.end() :]
    if not rest.startswith("//") or rest.startswith("///"):
        return _Refused(f"does not have exactly two slashes after '{scheme.group()}': {_PLAIN}")
    return _authority_host(_END_OF_AUTHORITY.split(rest[2:], maxsplit=1)[0])


def _refused_character(url: str) -> str | None:
    """The first character of `url` that no host check can read the same way as every client."""
    found = _ASCII_REFUSED.search(url)
    if not url.isascii():
        for character in _NON_ASCII.finditer(url, 0, found.start() if found else len(url)):
            if unicodedata.category(character.group()) in _REFUSED_CATEGORIES:
                return character.group()
    return found.group() if found else None


def _character_name(character: str) -> str:
    category = unicodedata.category(character)
    if category == "Cc":
        return "a control character"
    if category == "Cs":
        return "a lone surrogate"
    return unicodedata.name(character, "an unassigned or private-use character").lower()


def _authority_host(authority: str) -> _Host | _Refused:
    if not authority:
        return _Refused(f"has no host: {_PLAIN}")
    if not authority.isascii():
        return _Refused(
            "has non-ASCII characters in its host (Unicode letters, full-width dots or look-alikes), which "
            "clients map differently: write the host in ASCII, an internationalized name as its xn-- form"
        )
    if "@" in authority:
        return _Refused(
            "carries a user name or password before '@', which clients split from the host differently: "
            "send the URL without them (scheme://host/path); credentials belong in the tool's own settings"
        )
    if "%" in authority:
        return _Refused("has a percent-escape (%XX) in its host: write the host's characters plainly")
    if authority.startswith("["):
        end = authority.find("]")
        host, port = authority[1:end], authority[end + 1 :]
        if end < 0 or (port and not port.startswith(":")):
            return _Refused("has a '[' that does not enclose its host: write an IPv6 host as [2001:db8::1]")
    else:
        host, colon, port = authority.partition(":")
        port = colon + port
    if port:
        number = port[1:]
        if ":" in number:
            return _Refused("has more than one ':' after its host: write an IPv6 host in brackets ([2001:db8::1])")
        if not _PORT.fullmatch(number) or int(number) > 65535:
            return _Refused(
                f"has the port {number!r}: write the port as a number from 0 to 65535, or leave out the ':'"
            )
    if authority.startswith("["):
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return _Refused("has no valid IPv6 address in brackets: write it as [2001:db8::1], without a zone")
    return _name_host(host.lower())


def _name_host(host: str) -> _Host | _Refused:
    if host.endswith("."):
        return _Refused("ends its host with a dot, which clients send on differently: remove the trailing dot")
    labels = host.split(".")
    if "" in labels:
        return _Refused("has an empty label in its host (a leading dot or two dots in a row): remove it")
    if len(host) > _MAX_NAME_CHARS or not all(_LABEL.fullmatch(label) for label in labels):
        return _Refused(
            "has a host that is no plain DNS name: write letters, digits, '-' and '_' in labels of up to 63 "
            "characters separated by single dots"
        )
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        if _DOTTED_QUAD.fullmatch(host):
            return ipaddress.IPv4Address(host)
        return _Refused(
            "has a host that ends in a number but is no IPv4 address written as four decimal numbers (octal, "
            "hexadecimal, a single number and shortened forms are read differently): write it like 127.0.0.1"
        )
    for label in labels:
        if label.startswith("xn--") and not _is_a_label(label):
            return _Refused("has an xn-- label that is no valid internationalized name: write the name's exact A-label")
    return host


def _is_a_label(label: str) -> bool:
    """True when `label` (lower case) is the A-label IDNA gives the Unicode name it decodes to."""
    try:
        unicode = label[4:].encode("ascii").decode("punycode")
        return encodings.idna.ToASCII(unicode) == label.encode("ascii") and not _IDNA_DEVIATIONS.search(unicode)
    except UnicodeError:
        return False


@dataclass(frozen=True, slots=True)
class _AllowList:
    names: frozenset[str]
    parents: frozenset[str]
    """The domains of the `*.` entries: a host below one of them is allowed."""
    addresses: frozenset[_Address]

    def admits(self, host: _Host) -> bool:
        if not isinstance(host, str):
            return host in self.addresses
        if host in self.names:
            return True
        if self.parents:
            dot = host.find(".")
            while dot >= 0:
                if host[dot + 1 :] in self.parents:
                    return True
                dot = host.find(".", dot + 1)
        return False


def _entries(hosts: str | Sequence[str]) -> tuple[str, ...]:
    given = (hosts,) if isinstance(hosts, str) else hosts
    if not isinstance(given, Sequence):
        raise TypeError(f"hosts must be a host name or a sequence of them, got {hosts!r}")
    if not given:
        raise ValueError("hosts is empty: no URL could be allowed")
    for entry in given:
        if not isinstance(entry, str):
            raise TypeError(f"a host entry must be a string, got {entry!r}")
    return tuple(given)


@functools.lru_cache(maxsize=256)
def _allow_list(entries: tuple[str, ...]) -> _AllowList:
    names: set[str] = set()
    parents: set[str] = set()
    addresses: set[_Address] = set()
    for entry in entries:
        wildcard = entry.startswith("*.")
        text = entry[2:] if wildcard else entry
        address = _address_entry(text)
        if address is not None and not wildcard:
            addresses.add(address)
            continue
        if "*" in text or _FORBIDDEN_IN_DOMAIN.search(text):
            raise ValueError(
                f"host entry {entry!r} is not a host name: write 'docs.example', '*.example.com' or an IP "
                "address, without scheme, port or path"
            )
        host = _parse_host(text)
        if host is None:
            raise ValueError(f"host entry {entry!r} is not a valid host name")
        if not isinstance(host, str):
            if wildcard:
                raise ValueError(f"host entry {entry!r}: '*.' applies to domain names, not IP addresses")
            addresses.add(host)
        elif wildcard:
            parents.add(host)
        else:
            names.add(host)
    return _AllowList(frozenset(names), frozenset(parents), frozenset(addresses))


def _address_entry(text: str) -> ipaddress.IPv6Address | None:
    """An IPv6 entry, bracketed or not (IPv4 entries go through the host parser, shorthand included)."""
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if ":" not in inner or "%" in inner:
        return None
    try:
        return ipaddress.IPv6Address(inner)
    except ValueError:
        return None


def _parse_host(text: str) -> _Host | None:
    """A URL's host text, decoded and normalized (WHATWG's host parser); None if it is no valid host."""
    if text.startswith("["):
        if not text.endswith("]") or "%" in text:
            return None  # a zone id never leaves this machine by name; browsers refuse it too
        try:
            return ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            return None
    try:
        decoded = urllib.parse.unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _IDNA_DEVIATIONS.search(decoded) or _FORBIDDEN_IN_DOMAIN.search(decoded):
        return None
    try:
        domain = decoded.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return None
    if _FORBIDDEN_IN_DOMAIN.search(domain):
        return None
    if domain.endswith("."):
        domain = domain[:-1]
    if not domain:
        return None
    last = domain.rpartition(".")[2]
    if last.isdigit() or _HEX_LABEL.fullmatch(last):
        return _ipv4(domain)
    return domain


def _ipv4(text: str) -> ipaddress.IPv4Address | None:
    """WHATWG's IPv4 parser: one to four parts, each decimal, 0x-hexadecimal or 0-octal."""
    parts = text.split(".")
    if len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            return None
        numbers.append(number)
    if any(number > 255 for number in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    value = numbers[-1]
    for index, number in enumerate(numbers[:-1]):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _ipv4_number(part: str) -> int | None:
    if not part:
        return None
    if part[:2] in ("0x", "0X"):
        radix, digits = 16, part[2:]
    elif len(part) > 1 and part[0] == "0":
        radix, digits = 8, part[1:]
    else:
        radix, digits = 10, part
    # Checked first: int() would also take underscores, spaces and non-ASCII digits.
    if not _IPV4_PART[radix].fullmatch(digits):
        return None
    return int(digits, radix) if digits else 0


def _display(host: _Host) -> str:
    return f"[{host}]" if isinstance(host, ipaddress.IPv6Address) else str(host)
