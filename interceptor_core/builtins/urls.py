"""Is a URL's real host on an allow-list? `host_in` answers; `HostAllowList` denies calls that leave it.

The host is found the way a browser finds it (the WHATWG URL standard), not the way a regex or a
naive `urlsplit(url).hostname` does, because the difference is where the bypasses live:

- userinfo: `https://docs.example@evil.example/` goes to evil.example (the last `@` ends it);
- backslashes: `https://evil.example\\@docs.example/` goes to evil.example: in http(s) and ws(s)
  URLs a browser reads `\\` as `/`, and so does this module;
- leading and trailing C0 controls and spaces are stripped, and tabs and newlines anywhere removed,
  as browsers do (`https://ev<TAB>il.example` is evil.example); any other control character or
  space in a host is refused;
- extra slashes (`https:///evil.example`, `https:evil.example`) and scheme-less `//evil.example/`
  still name evil.example;
- percent-escapes in the host are decoded (`%65vil.example` is evil.example); one that decodes to
  invalid UTF-8 or to a character a host cannot hold (`/`, `@`, `%00`, ...) makes the URL hostless;
- internationalized names are compared as A-labels (`bücher.example` is `xn--bcher-kva.example`),
  encoded with the standard library's IDNA codec (IDNA 2003 with nameprep, which also folds case
  and full-width forms); a host it cannot encode is refused, and so is one holding ß, final sigma,
  ZWJ or ZWNJ, the characters IDNA 2003 maps differently from today's browsers and HTTP clients;
- case and one trailing dot do not matter (`DOCS.Example.` is docs.example);
- numeric hosts are read as IP addresses: IPv6 literals in brackets, and IPv4 in every form a
  browser (and `inet_aton`, so curl) accepts: decimal, hexadecimal and octal parts, one to four of
  them (`2130706433`, `0x7f000001`, `0x7f.1`, `0177.0.0.1` and `127.1` are all 127.0.0.1). A host
  whose last label is a number but that is no valid IPv4 address is refused, as browsers refuse it.

Only http, https, ws and wss URLs have a host here; any other scheme (`file:`, `mailto:`, `ftp:`,
`javascript:`), a relative URL and a URL with an empty host have none, and are never allowed.
"""

from __future__ import annotations

import functools
import ipaddress
import re
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

_SCHEMES_WITH_HOSTS = frozenset({"http", "https", "ws", "wss"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_C0_CONTROL_OR_SPACE = "".join(map(chr, range(0x21)))
_NO_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")
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
    """True when `url` is an http, https, ws or wss URL whose host is on the `hosts` allow-list.

    The host is read as a browser reads it (see this module's docstring for the tricks that are
    seen through). An entry of `hosts` is a host name, matched exactly after the same normalization
    (case, IDNA, one trailing dot); `*.example.com`, which matches every proper subdomain of
    example.com (`a.example.com`, `a.b.example.com`) but neither example.com itself nor
    badexample.com; an IPv4 address in any form above (`127.0.0.1` then matches `http://127.1/`);
    or an IPv6 address, bracketed or not. Ports are ignored: an entry allows every port.

    Never raises for `url`, which is the model's: anything that is not such a URL with a host is
    False. Raises `TypeError` or `ValueError` for a bad `hosts` (not a str or a sequence of str, no
    entries, an entry that is a URL, holds a port or path, or is not a valid host). Does no I/O (no
    DNS): a name that resolves to an address is not compared with the address. An allow-list is
    compiled once and remembered (for the 256 most recent lists).
    """
    allowed = _allow_list(_entries(hosts))
    host = _url_host(url)
    return host is not None and allowed.admits(host)


class HostAllowList:
    """Denies a call whose URL arguments point at a host that is not on the allow-list (see `host_in`).

    `fields` names the arguments holding URLs (one name or several); an argument the tool does not
    have is skipped, and so is one whose value is None. A list or tuple value is checked URL by URL.
    `tools` restricts the check to the tools matching one of its globs (`fnmatch.fnmatchcase`;
    None: every tool). The denial names the tool, the argument and the host it saw (never the rest
    of the URL, which may carry credentials), and the allowed hosts.

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
            if host is None:
                return Deny(
                    f"{tool}: argument {field!r} is not an http, https, ws or wss URL with a host, so it cannot "
                    f"be checked against the hosts this tool may reach ({', '.join(self.hosts)})."
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


def _url_host(url: object) -> _Host | None:
    """The host a browser would connect to for `url`, normalized; None if it has none we consider."""
    if not isinstance(url, str):
        return None
    text = url.strip(_C0_CONTROL_OR_SPACE).translate(_NO_TAB_OR_NEWLINE).replace("\\", "/")
    scheme = _SCHEME.match(text)
    if scheme is not None:
        if scheme.group()[:-1].lower() not in _SCHEMES_WITH_HOSTS:
            return None
        rest = text[scheme.end() :]
    elif text.startswith("//"):
        rest = text
    else:
        return None  # a relative URL: no host of its own
    try:
        # A browser skips any run of slashes before the authority of an http(s) or ws(s) URL.
        netloc = urllib.parse.urlsplit("//" + rest.lstrip("/")).netloc
    except ValueError:
        return None
    host_and_port = netloc.rpartition("@")[2]
    if host_and_port.startswith("["):
        end = host_and_port.find("]")
        if end < 0:
            return None
        host, after = host_and_port[: end + 1], host_and_port[end + 1 :]
        if after and not after.startswith(":"):
            return None
        port = after[1:]
    else:
        host, _, port = host_and_port.partition(":")
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return None
    return _parse_host(host)


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
