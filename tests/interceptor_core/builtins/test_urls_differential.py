"""`host_in` against the URL parsers HTTP clients use: httpx, urllib3, `urllib.parse` and Node's
WHATWG `URL` (one Node process, whatwg_hosts.mjs, reads every URL).

For each URL of a corpus (hand-written attacks, the bypass corpus of `host_in`, every plain spelling
of allowed and other hosts, and a seeded sample of hostile mixtures), each parser says which host it
reaches, or that it cannot parse the URL. Whenever one of them reaches a host outside the allow-list,
or fails, `host_in` must refuse; and whenever `host_in` allows a URL, every parser reaches the very
host `host_in` decided on.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import random
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3.util
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor_core.builtins import host_in
from interceptor_core.builtins.urls import _url_host

HERE = Path(__file__).parent
NODE = shutil.which("node")
HOSTS = ["example.com", "*.example.org", "10.0.0.1", "::1"]

PLAIN_SCHEMES = ["http://", "https://", "HTTPS://", "ws://", "wss://"]
ALLOWED_HOSTS = [
    "example.com",
    "Example.COM",
    "www.example.org",
    "a.b.example.org",
    "xn--bcher-kva.example.org",
    "10.0.0.1",
    "[::1]",
    "[0:0::1]",
]
OTHER_HOSTS = ["evil.com", "example.com.evil.com", "example.org", "wwwexample.org", "10.0.0.2", "[::2]"]
PLAIN_PORTS = ["", ":8080", ":443"]
PLAIN_TAILS = ["", "/", "/a/b?c=d#e", "/caf\u00e9?q=\u00e9@evil.com"]

HOSTILE_SCHEMES = [
    "https:",
    "https:/",
    "https:///",
    "https:\\\\",
    "https:/\\",
    "//",
    "\\\\",
    "",
    " https://",
    "\x00https://",
    "ht\ttps://",
    "ftp://",
    "file://",
    "javascript://",
]
HOSTILE_USERINFO = [
    "user@",
    "user:pw@",
    "example.com@",
    "example.com:443@",
    "example.com\\@",
    "example.com\x00@",
    "example.com\t@",
    "example.com%40",
    "example.com%2F@",
    "example.com#@",
    "example.com?@",
    "example.com/@",
    "a@example.com@",
    "example.com\uff0f@",
    "@",
]
HOSTILE_HOSTS = [
    "example.com.",
    "www.example.org..",
    ".example.com",
    "ex%61mple.com",
    "exam\tple.com",
    "exam\nple.com",
    "ex ample.com",
    "example\u3002com",
    "example\uff0ecom",
    "\uff45xample.com",
    "ex\u0430mple.com",
    "exa\u00admple.com",
    "example.com\u200b",
    "example.c\u1d0fm",
    "xn--exmple-cua.com",
    "XN--BCHER-KVA.example.org",
    "xn--.example.org",
    "xn--fa-hia.example.org",
    "fa\u00df.example.org",
    "b\u00fccher.example.org",
    "010.0.0.1",
    "0xa.0.0.1",
    "0xA000001",
    "167772161",
    "10.1",
    "10.0.1",
    "10.0.0.01",
    "10.0.0.1.",
    "10.0.0.1.example.com",
    "1.2.3.4.5",
    "[::ffff:10.0.0.1]",
    "[::1%25lo]",
    "[::1",
    "::1",
    "[v1.x]",
    "www.example.org!evil.com",
    "www.example.org$evil.com",
    'www.example.org"evil.com',
    "www.example.org{evil.com}",
    "www.example.org|evil.com",
    "www.example.org^evil.com",
    "www.example.org<evil.com>",
    "www.example.org;.evil.com",
    "www.example.org,evil.com",
    "www.example.org=evil.com",
    "www.example.org&evil.com",
    "www.example.org~evil.com",
    "*.example.org",
    "-www.example.org",
    "exa_mple.com",
]
HOSTILE_PORTS = [":", ":0443", ":99999", ":8a", ":+80", ": 80", ":\u0664\u0664\u0663", ":0x50", ":80:80"]
HOSTILE_TAILS = [
    "\\@evil.com/",
    "/\\evil.com",
    "@evil.com",
    "#@evil.com",
    "?@evil.com",
    "\\.evil.com",
    "\x00@evil.com",
    "%00@evil.com",
    " @evil.com",
    "\u202e",
    "/\ud800",
    "\x7f",
    "\uff03@evil.com",
    "\uff1f.evil.com",
    "\u2044@evil.com",
]
HAND_WRITTEN = [
    "https://example.com\\@evil.com/",
    "https://evil.com\\@example.com/",
    "https://evil.com\\.example.com/",
    "https://evil.com/\\@example.com/",
    "https://evil.com#@example.com/",
    "https://evil.com?@example.com/",
    "https://evil.com;@example.com/",
    "https://example.com&@evil.com#@example.com/",
    "http://[::1]@evil.com/",
    "http://evil.com:80#@example.com/",
    "http:/\\evil.com",
    "http:\\\\evil.com",
    "http:evil.com",
    "http:///evil.com",
    "///evil.com",
    "\\\\evil.com",
    "https://evil.com ",
    "https://\u3002evil.com",
    "https://evil.com\uff03@example.com",
    "https://evil.com\uff1f.example.com",
    "http://127.0.0.1/",
    "http://0/",
    "http://localhost/",
    "javascript:alert(1)//example.com",
    "mailto:a@example.com",
    "example.com",
    "example.com:443",
    "https://example.com/" + "a" * 70_000,
    "https://" + "a." * 130 + "example.org/",
    "https://" + "a" * 64 + ".example.org/",
    "https:\x00//example.com",
    "https://example.com/\x00",
]


def corpus() -> list[str]:
    """Every URL the test reads, each once, in a stable order."""
    plain = [
        "".join(parts)
        for parts in itertools.product(PLAIN_SCHEMES, ALLOWED_HOSTS + OTHER_HOSTS, PLAIN_PORTS, PLAIN_TAILS)
    ]
    slots = [
        (PLAIN_SCHEMES, HOSTILE_SCHEMES),
        ([""], HOSTILE_USERINFO),
        (ALLOWED_HOSTS + OTHER_HOSTS, HOSTILE_HOSTS),
        (PLAIN_PORTS, HOSTILE_PORTS),
        (PLAIN_TAILS, HOSTILE_TAILS),
    ]
    rng = random.Random(39)
    mixed = []
    for _ in range(700):
        # Each slot is hostile with probability 1/3, so most URLs mix one or two tricks into a plain URL.
        mixed.append("".join(rng.choice(hostile if rng.random() < 1 / 3 else clean) for clean, hostile in slots))
    # Each hostile piece at least once, alone in an otherwise plain URL.
    alone = [
        "".join(hostile if index == position else clean[0] for index, (clean, _) in enumerate(slots))
        for position, (_, pieces) in enumerate(slots)
        for hostile in pieces
    ]
    bypass = yaml.safe_load((HERE / "corpus" / "host_in.yaml").read_text(encoding="utf-8"))["cases"]
    from_bypass = [case["value"] for case in bypass if isinstance(case.get("value"), str)]
    return list(dict.fromkeys([*HAND_WRITTEN, *from_bypass, *alone, *plain, *mixed]))


Reading = str | ipaddress.IPv4Address | ipaddress.IPv6Address | None
"""A parser's host, normalized only as an address or in case; None: it did not parse the URL."""


def _normal(host: str | None) -> Reading:
    if host is None:
        return ""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(inner)
    except ValueError:
        return host.lower()


def _httpx(url: str) -> Reading:
    try:
        return _normal(httpx.URL(url).raw_host.decode("ascii"))
    except (httpx.InvalidURL, UnicodeError):
        return None


def _urllib3(url: str) -> Reading:
    try:
        return _normal(urllib3.util.parse_url(url).host)
    except (urllib3.exceptions.LocationParseError, ValueError):
        return None


def _urllib(url: str) -> Reading:
    try:
        return _normal(urllib.parse.urlsplit(url).hostname)
    except ValueError:
        return None


def _whatwg(urls: list[str]) -> list[Reading]:
    """Node's readings, one process for all of them."""
    assert NODE is not None, "Node.js is missing: `make venv` installs Debian's nodejs"
    done = subprocess.run(
        [NODE, str(HERE / "whatwg_hosts.mjs")],
        input="".join(json.dumps(url) + "\n" for url in urls),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(urls), done.stderr
    return [_normal(answer["host"]) if "host" in answer else None for answer in answers]


def _allowed(reading: Reading) -> bool:
    """The allow-list, written again without `host_in`'s own parser."""
    if isinstance(reading, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return reading in (ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("::1"))
    return reading is not None and (reading == "example.com" or reading.endswith(".example.org"))


@dataclass(frozen=True)
class Verdict:
    url: str
    readings: dict[str, Reading]
    allowed: bool
    decided: Any

    @property
    def some_parser_leaves(self) -> bool:
        return any(not _allowed(reading) for reading in self.readings.values())


@pytest.fixture(scope="module")
def verdicts() -> list[Verdict]:
    urls = corpus()
    whatwg = _whatwg(urls)
    return [
        Verdict(
            url,
            {"httpx": _httpx(url), "urllib3": _urllib3(url), "urllib.parse": _urllib(url), "WHATWG": node},
            host_in(url, HOSTS),
            _url_host(url),
        )
        for url, node in zip(urls, whatwg, strict=True)
    ]


def _show(verdict: Verdict) -> str:
    return f"{verdict.url[:100]!r}: {verdict.readings}"


def test_the_corpus_is_large_and_holds_what_parsers_disagree_on(verdicts: list[Verdict]) -> None:
    """Over a thousand URLs; hundreds allowed, hundreds on which the four parsers do not all agree."""
    assert len(verdicts) > 1000
    assert sum(v.allowed for v in verdicts) > 300
    disagreements = [v for v in verdicts if len(set(map(str, v.readings.values()))) > 1]
    assert len(disagreements) > 100
    issue = next(v for v in verdicts if v.url == "https://example.com\\@evil.com/")
    assert issue.readings["urllib3"] == issue.readings["WHATWG"] == "example.com"
    assert issue.readings["httpx"] == issue.readings["urllib.parse"] == "evil.com"


def test_whenever_a_parser_leaves_the_list_or_fails_host_in_refuses(verdicts: list[Verdict]) -> None:
    """No URL is allowed that one of httpx, urllib3, urllib.parse or WHATWG reads as another host."""
    allowed_yet_left = [_show(v) for v in verdicts if v.allowed and v.some_parser_leaves]
    assert allowed_yet_left == []


def test_an_allowed_url_reaches_the_host_host_in_decided_on_in_every_parser(verdicts: list[Verdict]) -> None:
    """For each allowed URL, all four parsers give exactly the host the check compared."""
    differing = [_show(v) for v in verdicts if v.allowed and set(v.readings.values()) != {v.decided}]
    assert differing == []


def test_every_plain_url_of_an_allowed_host_is_allowed() -> None:
    """The check refuses spellings, never plain URLs: each scheme, allowed host, port and path passes."""
    refused = [
        "".join(parts)
        for parts in itertools.product(PLAIN_SCHEMES, ALLOWED_HOSTS, PLAIN_PORTS, PLAIN_TAILS)
        if not host_in("".join(parts), HOSTS)
    ]
    assert refused == []


PIECES = [
    *("https://", "http://", "wss://", "https:", "//", "/", "\\", "@", ":", "443", "#", "?", ".", "%2e", "%40"),
    *("example.com", "www.", "example.org", "evil.com", "10.0.0.1", "0xa", "1", "[", "]", "::1", "xn--", "bcher-kva"),
    *("\u3002", "\uff0e", "\uff0f", "\uff45", "\u0430", "\u200b", "\u00ad", "\0", "\ud800", " ", "\t", "\x7f", "~"),
]


MIXTURES = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)
URLS = st.one_of(
    MIXTURES,
    st.tuples(
        st.sampled_from(["https://", "http://", "WSS://"]),
        st.sampled_from(ALLOWED_HOSTS),
        st.sampled_from(["", "/", ":8080/", "?", "#"]),
        st.lists(st.sampled_from(PIECES), max_size=3).map("".join),
    ).map("".join),
)


@settings(deadline=None, max_examples=500)
@given(url=URLS)
def test_a_url_allowed_from_any_mixture_is_read_alike_by_the_python_clients(url: str) -> None:
    """Any mixture of URL pieces and tricks, alone or after a plain allowed host: if `host_in` allows
    it, httpx, urllib3 and urllib.parse all reach the host it decided on, and that host is on the list."""
    if host_in(url, HOSTS):
        decided = _url_host(url)
        assert _allowed(decided)  # type: ignore[arg-type]
        assert {_httpx(url), _urllib3(url), _urllib(url)} == {decided}
