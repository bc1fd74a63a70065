"""`host_in` and `HostAllowList`: the tricks that make a URL's host look like another, each tried."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor_core import ConfigurationError, Deny, Gate, tool
from interceptor_core.builtins import HostAllowList, host_in
from interceptor_core.decisions import Allow
from interceptor_core.testing import check_before, make_call

DOCS = ["docs.example"]


class TestHostIn:
    @pytest.mark.parametrize(
        "url",
        [
            "https://docs.example/",
            "https://docs.example",
            "http://docs.example/a?b#c",
            "wss://docs.example/socket",
            "ws://docs.example:8080/",
            "HTTPS://DOCS.EXAMPLE/",
            "https://docs.example:443/",
            "https://docs.example:0/",
            "https://docs.example/caf\u00e9?q=\u00e9#\u00e9",
            "https://docs.example/a@evil.example",
            "https://docs.example?next=https://evil.example/",
            "https://docs.example#@evil.example",
            "https://docs.example/%5C@evil.example",
        ],
    )
    def test_plain_urls_of_the_allowed_host_are_allowed(self, url: str) -> None:
        """Scheme and host case, ports, and anything in the path, query or fragment keep the host."""
        assert host_in(url, DOCS)

    @pytest.mark.parametrize(
        "url",
        [
            "https://docs.example@evil.example/",
            "https://docs.example:443@evil.example/",
            "https://a@docs.example@evil.example/",
            "https://evil.example\\@docs.example/",
            "https://evil.example\\.docs.example/",
            "https://evil.example/\\@docs.example/",
            "https://evil.example#@docs.example/",
            "https://evil.example?@docs.example/",
            "//evil.example/docs.example",
            "\\\\evil.example/docs.example",
            "https://docs.example.evil.example/",
            "https://docs.example\n.evil.example/",
            "https://evildocs.example/",
            "https://docs.examples/",
        ],
    )
    def test_a_url_that_really_goes_elsewhere_is_refused(self, url: str) -> None:
        """Userinfo, backslashes, fragments and lookalike suffixes never reach the allowed host."""
        assert not host_in(url, DOCS)

    @pytest.mark.parametrize(
        ("url", "reason"),
        [
            ("https://user:pass@docs.example/", "user name or password before '@'"),
            ("https://docs.example\0@evil.example/", "U+0000 (a control character)"),
            ("https://evil.example%2F@docs.example/", "user name or password before '@'"),
            ("https://@docs.example/", "user name or password before '@'"),
            ("https://docs.example./", "remove the trailing dot"),
            ("https://docs.example:/", "port ''"),
            ("https://docs.example:+443/", "port '+443'"),
            ("https://docs.example:\u0664\u0664\u0663/", "non-ASCII"),
            ("https://docs.example:443:443/", "more than one ':'"),
            ("//docs.example/x", "is not a full URL"),
            ("docs.example/x", "is not a full URL"),
            ("https:///docs.example/", "exactly two slashes"),
            ("https:docs.example/", "exactly two slashes"),
            ("https:\\\\docs.example/", "backslash"),
            ("  https://docs.example/  ", "U+0020 (space)"),
            ("\x00\x1f https://docs.example/ \x0c", "U+0000"),
            ("ht\ttps://docs.\nexample/", "U+0009"),
            ("https://docs.example/a b", "U+0020"),
            ("https://docs.example/\x7f", "U+007F"),
            ("https://docs.example/\u200b", "U+200B (zero width space)"),
            ("https://docs.example/\u202e", "U+202E (right-to-left override)"),
            ("https://docs.example/\ud800", "U+D800 (a lone surrogate)"),
            ("https://docs.example/\ue000", "U+E000 (an unassigned or private-use character)"),
            ("https://docs.example/\u2028", "U+2028 (line separator)"),
            ("https://docs.example\\path", "backslash"),
            ("https://%64ocs.example/", "percent-escape"),
            ("https://\uff44\uff4f\uff43\uff53\u3002example/", "non-ASCII"),
            ("https://docs\u3002example/", "non-ASCII"),
            ("https://d\u043ecs.example/", "non-ASCII"),
            ("https://docs.example/" + "a" * 65_516, "longer than 65536 characters"),
        ],
    )
    def test_a_spelling_clients_read_differently_is_refused_with_what_to_write(self, url: str, reason: str) -> None:
        """Userinfo, NUL and other controls, format characters, surrogates, backslashes, escapes, Unicode
        hosts and slashes other than two are refused even around the allowed host; the denial says why."""
        assert not host_in(url, [*DOCS, "evil.example"])
        decision = HostAllowList("url", [*DOCS, "evil.example"]).before_tool_call(make_call(fetcher([]), {"url": url}))
        assert isinstance(decision, Deny)
        assert reason in decision.message
        assert decision.message.endswith("The hosts this tool may reach: docs.example, evil.example.")

    def test_the_longest_url_read_is_httpx_s_longest(self) -> None:
        """65536 characters are read, one more is refused, as httpx does."""
        url = "https://docs.example/" + "a" * (65_536 - len("https://docs.example/"))
        assert host_in(url, DOCS)
        assert httpx.URL(url).host == "docs.example"
        assert not host_in(url + "a", DOCS)
        with pytest.raises(httpx.InvalidURL):
            httpx.URL(url + "a")

    @pytest.mark.parametrize(
        "url",
        [
            "https://docs.example%2F.evil.example/",
            "https://docs%00.example/",
            "https://docs%ff.example/",
            "https://docs .example/",
            "https://docs\x01.example/",
            "https://docs..example/",
            "https://.docs.example/",
            "https://docs!.example/",
            'https://docs".example/',
            "https://docs{x}.example/",
            "https://*.docs.example/",
            "https://a" + "b" * 64 + ".example/",
            "https://" + "a." * 125 + "docs.example/",
            "https://docs.example:99999/",
            "https://docs.example:44a/",
            "https://docs.example:-1/",
            "https://:443/",
            "https:///",
            "https://@/",
            "https://",
        ],
    )
    def test_a_host_that_is_no_valid_host_is_refused(self, url: str) -> None:
        """Escapes, spaces, controls, empty labels, characters outside DNS names, too long, bad ports."""
        assert not host_in(url, [*DOCS, "evil.example", "*.docs.example"])

    @pytest.mark.parametrize(
        "url",
        [
            "file:///etc/passwd",
            "file://docs.example/etc/passwd",
            "mailto:someone@docs.example",
            "ftp://docs.example/",
            "javascript://docs.example/%0aalert(1)",
            "data:text/html,docs.example",
            "docs.example/path",
            "/docs.example/path",
            "docs.example:443",
            "",
            "   ",
        ],
    )
    def test_urls_without_a_web_host_are_refused(self, url: str) -> None:
        """Other schemes, relative references and scheme-less host:port strings have no host here."""
        assert not host_in(url, DOCS)

    def test_values_that_are_not_strings_are_refused(self) -> None:
        """None, bytes, numbers and lists never raise and are never allowed."""
        for value in (None, b"https://docs.example/", 42, ["https://docs.example/"]):
            assert not host_in(value, DOCS)

    def test_a_wildcard_allows_proper_subdomains_only(self) -> None:
        """`*.example.com` allows a.example.com and a.b.example.com, not example.com or badexample.com."""
        hosts = ["*.example.com"]
        assert host_in("https://a.example.com/", hosts)
        assert host_in("https://a.b.example.com/", hosts)
        assert host_in("https://A.Example.COM/", hosts)
        assert not host_in("https://example.com/", hosts)
        assert not host_in("https://badexample.com/", hosts)
        assert not host_in("https://example.com.evil.example/", hosts)
        assert not host_in("https://a.example.com@evil.example/", hosts)

    def test_an_internationalized_host_is_read_as_its_a_label(self) -> None:
        """A URL names an internationalized host by its xn-- A-label (any case); an entry may be written
        either way. The Unicode spelling in a URL is refused: clients map it by different IDNA rules."""
        assert host_in("https://xn--bcher-kva.example/", ["bücher.example"])
        assert host_in("https://XN--BCHER-KVA.example/", ["xn--bcher-kva.example"])
        assert not host_in("https://bücher.example/", ["bücher.example"])
        assert not host_in("https://%C3%BCber.example/", ["über.example"])

    @pytest.mark.parametrize("label", ["xn--", "xn--zz", "xn--abc-", "xn--a", "xn--fa-hia"])
    def test_an_xn_label_that_is_no_exact_a_label_is_refused(self, label: str) -> None:
        """Punycode that does not decode, decodes to ASCII, or to ß (read differently across IDNA versions)."""
        assert not host_in(f"https://{label}.docs.example/", ["*.docs.example"])

    def test_characters_idna_versions_disagree_on_are_refused_in_entries(self) -> None:
        """ß, ς, ZWJ and ZWNJ map differently across IDNA versions: an entry holding one is refused."""
        with pytest.raises(ValueError, match="not a valid host"):
            host_in("https://fass.example/", ["faß.example"])

    def test_a_canonical_ipv4_address_is_read_as_the_address(self) -> None:
        """Four decimal numbers, and the entry may be written in any form `inet_aton` reads."""
        assert host_in("http://127.0.0.1/", ["127.0.0.1"])
        assert host_in("http://127.0.0.1:8080/", ["127.1"])
        assert host_in("http://10.0.0.255/", ["0xa.0.0.0377"])
        assert not host_in("http://127.0.0.2/", ["127.0.0.1"])

    @pytest.mark.parametrize(
        "url",
        [
            "http://127.0.0.1./",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0X7F000001/",
            "http://0x7f.1/",
            "http://127.1/",
            "http://127.0.1/",
            "http://0177.0.0.1/",
            "http://127.0.0.01/",
            "http://%31%32%37.0.0.1/",
            "http://１２７.0.0.1/",
            "http://user@127.1:8080/",
            "http://1.2.3.4.5/",
            "http://256.0.0.1/",
            "http://1.2.3.256/",
            "http://4294967296/",
            "http://09.1.1.1/",
            "http://docs.example.0x1/",
            "http://docs.example.123/",
        ],
    )
    def test_ipv4_in_another_form_or_a_name_ending_in_a_number_is_refused(self, url: str) -> None:
        """Browsers and resolvers read octal, hex, integer and shortened IPv4 as an address, other parsers
        as a name: such a host is refused whatever the list, with the form to use instead."""
        hosts = ["127.0.0.1", "1.2.3.4", "docs.example", "*.docs.example"]
        assert not host_in(url, hosts)
        decision = HostAllowList("url", hosts).before_tool_call(make_call(fetcher([]), {"url": url}))
        assert isinstance(decision, Deny)

    def test_ipv6_literals_compare_as_addresses(self) -> None:
        """Bracketed IPv6 in any spelling matches an entry bracketed or not; zone ids are refused."""
        assert host_in("http://[::1]/", ["::1"])
        assert host_in("http://[0:0:0:0:0:0:0:1]:8080/", ["[::1]"])
        assert host_in("http://[2001:DB8::1]/", ["2001:db8::1"])
        assert not host_in("http://[::2]/", ["::1"])
        assert not host_in("http://[::ffff:127.0.0.1]/", ["127.0.0.1"])
        assert not host_in("http://[::1%25eth0]/", ["::1"])
        assert not host_in("http://[::1/", ["::1"])
        assert not host_in("http://[::1]x/", ["::1"])
        assert not host_in("http://[not-an-ip]/", ["::1"])
        assert not host_in("http://::1/", ["::1"])

    def test_an_address_entry_never_matches_a_name_or_the_reverse(self) -> None:
        """`localhost` is not 127.0.0.1: no DNS is done."""
        assert not host_in("http://localhost/", ["127.0.0.1"])
        assert not host_in("http://127.0.0.1/", ["localhost"])

    def test_one_entry_may_be_given_alone(self) -> None:
        """A single host as a string is one entry."""
        assert host_in("https://docs.example/", "docs.example")

    @pytest.mark.parametrize(
        ("hosts", "error"),
        [
            ([], ValueError),
            ([42], TypeError),
            (42, TypeError),
            (["https://docs.example"], ValueError),
            (["docs.example:443"], ValueError),
            (["docs.example/path"], ValueError),
            (["user@docs.example"], ValueError),
            (["*"], ValueError),
            (["*."], ValueError),
            (["a.*.example"], ValueError),
            (["*.127.0.0.1"], ValueError),
            (["docs..example"], ValueError),
            (["1.2.3.4.5"], ValueError),
            ([" docs.example"], ValueError),
        ],
    )
    def test_bad_entries_raise(self, hosts: Any, error: type[Exception]) -> None:
        """An entry that is a URL, holds a port or a path, or is no valid host is the author's mistake."""
        with pytest.raises(error):
            host_in("https://docs.example/", hosts)


def _ipv4_part(number: int, form: str) -> str:
    return {"dec": str(number), "hex": hex(number), "oct": "0" + oct(number)[2:]}[form]


class TestIpv4Property:
    @given(
        address=st.integers(min_value=0, max_value=2**32 - 1),
        parts=st.integers(min_value=1, max_value=4),
        forms=st.lists(st.sampled_from(["dec", "hex", "oct"]), min_size=4, max_size=4),
    )
    def test_only_the_dotted_quad_is_read_and_entries_agree_with_inet_aton(
        self, address: int, parts: int, forms: list[str]
    ) -> None:
        """Any address in one to four parts of any base: as an entry it is the address inet_aton reads;
        in a URL only the four-decimal form is allowed, every other form refused."""
        octets = address.to_bytes(4, "big")
        numbers = [*octets[: parts - 1], int.from_bytes(octets[parts - 1 :], "big")]
        host = ".".join(_ipv4_part(number, form) for number, form in zip(numbers, forms, strict=False))
        dotted = socket.inet_ntoa(socket.inet_aton(host))
        assert dotted == socket.inet_ntoa(octets)
        assert host_in(f"http://{dotted}/", [host])
        assert host_in(f"http://{host}/", [dotted]) is (host == dotted)


HOSTS = ["docs.example", "*.docs.example", "127.0.0.1", "::1"]
PLAIN_URLS = ["https://docs.example/", "http://docs.example:8080/a?b#c", "wss://api.docs.example/x", "http://[::1]/"]
UNREADABLE_CHARACTERS = st.one_of(
    st.characters(categories=["Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"]),
    st.sampled_from(["\0", "\\", "\ud800", "\udfff", "\u200b", "\u200d", "\u202e", "\u2066", "\ufeff", "\u00ad"]),
)
CONFUSABLES = st.sampled_from(
    [
        *("\u3002", "\uff0e", "\uff61", "\u2024", "\uff0f", "\u2044", "\u2215", "\uff20", "\ufe6b", "\uff1a"),
        *("\u0430", "\u043e", "\u0441", "\u0435", "\u0131", "\u017f", "\u212a", "\uff44", "\u1d0f", "\u0501"),
    ]
)
ADVERSARIAL = st.lists(
    st.one_of(
        UNREADABLE_CHARACTERS,
        CONFUSABLES,
        st.sampled_from(["https://", "//", "@", ":", "/", "\\", "%2e", "%00", "docs.example", "evil.example", "[::1]"]),
        st.text(max_size=6),
    ),
    max_size=12,
).map("".join)


def _judged(url: str) -> tuple[bool, bool]:
    """(plain function allows, interceptor allows) for `url`."""
    decision = HostAllowList("url", HOSTS).before_tool_call(make_call(fetcher([]), {"url": url}))
    return host_in(url, HOSTS), decision is None


class TestHostInProperties:
    # No deadline: the machine's load, not the check, sets how long one example takes.
    @settings(deadline=None)
    @given(url=st.sampled_from(PLAIN_URLS), at=st.integers(min_value=0, max_value=40), character=UNREADABLE_CHARACTERS)
    def test_a_url_holding_a_control_format_space_or_surrogate_character_is_refused(
        self, url: str, at: int, character: str
    ) -> None:
        """Wherever it stands, in scheme, host, port or path, the URL is refused on both Python routes."""
        assert _judged(url[:at] + character + url[at:]) == (False, False)

    @settings(deadline=None)
    @given(url=st.sampled_from(PLAIN_URLS), character=CONFUSABLES)
    def test_a_confusable_in_the_host_is_refused(self, url: str, character: str) -> None:
        """A full-width or ideographic dot, a look-alike slash, at sign or colon, a homoglyph letter."""
        scheme_end = url.index("//") + 2
        at = scheme_end + 3
        assert _judged(url[:at] + character + url[at:]) == (False, False)

    @settings(deadline=None)
    @given(prefix=st.sampled_from(["https://docs.example/", "https://", "https://docs.example", ""]), text=ADVERSARIAL)
    def test_the_plain_function_and_the_interceptor_agree(self, prefix: str, text: str) -> None:
        """On any adversarial string, the two Python routes give the same verdict."""
        allowed, let_through = _judged(prefix + text)
        assert allowed is let_through

    @settings(deadline=None)
    @given(length=st.integers(min_value=0, max_value=70_000), ending=st.sampled_from(["", "\0", "\ud800", "\u200b"]))
    def test_a_long_url_is_read_whole(self, length: int, ending: str) -> None:
        """A long URL is allowed up to 65536 characters, and a character at its very end is still seen."""
        url = "https://docs.example/" + "a" * length + ending
        assert _judged(url) == ((len(url) <= 65_536 and not ending),) * 2


def fetcher(seen: list[str]) -> Any:
    @tool
    def fetch(url: str) -> str:
        """Fetches a URL."""
        seen.append(url)
        return "page"

    return fetch


class TestHostAllowList:
    async def test_through_a_gate_another_host_is_denied_before_the_tool_runs(self) -> None:
        """The denial names the tool, the argument, the host seen and the allowed hosts."""
        seen: list[str] = []
        desk = Gate("g", interceptors=[HostAllowList("url", ["docs.example", "*.docs.example"])]).agent(
            "a", tools=[fetcher(seen)]
        )
        denied = await desk.call("fetch", {"url": "https://evil.example/x?token=hunter2"})
        assert denied.kind == "denied"
        assert seen == []
        message = denied.message or ""
        assert "fetch" in message
        assert "'url'" in message
        assert "'evil.example'" in message
        assert "hunter2" not in message
        assert "docs.example, *.docs.example" in message
        allowed = await desk.call("fetch", {"url": "https://api.docs.example/x"})
        assert allowed.kind == "ok"
        assert seen == ["https://api.docs.example/x"]

    async def test_credentials_in_a_url_are_refused_without_being_quoted(self) -> None:
        """Userinfo is refused whatever the host, and the denial says to send the URL without it."""
        seen: list[str] = []
        desk = Gate("g", interceptors=[HostAllowList("url", DOCS)]).agent("a", tools=[fetcher(seen)])
        denied = await desk.call("fetch", {"url": "https://docs.example:hunter2@docs.example/x"})
        assert denied.kind == "denied"
        assert seen == []
        message = denied.message or ""
        assert "hunter2" not in message
        assert "send the URL without them" in message

    async def test_a_url_without_a_host_is_denied_without_being_quoted(self) -> None:
        """A file: URL has no host to allow; the denial says so and what to write."""
        decision = await check_before(HostAllowList("url", DOCS), fetcher([]), {"url": "file:///etc/passwd"})
        assert isinstance(decision, Deny)
        assert "is not an http, https, ws or wss URL: write it as scheme://host" in decision.message
        assert "/etc/passwd" not in decision.message

    async def test_the_host_seen_is_shown_normalized(self) -> None:
        """IPv4 as the address, IPv6 compressed in brackets, names in lower case."""
        check = HostAllowList("url", DOCS)
        for url, shown in [
            ("http://127.0.0.1/", "'127.0.0.1'"),
            ("http://[0:0::1]/", "'[::1]'"),
            ("https://XN--BCHER-KVA.example/", "'xn--bcher-kva.example'"),
        ]:
            decision = await check_before(check, fetcher([]), {"url": url})
            assert isinstance(decision, Deny)
            assert shown in decision.message

    async def test_only_matching_tools_and_present_fields_are_checked(self) -> None:
        """Other tools, absent fields and None values pass; a list is checked URL by URL."""

        @tool
        def crawl(urls: list[str], proxy: str | None = None) -> str:
            """Crawls pages."""
            return ""

        check = HostAllowList(["urls", "proxy", "target"], DOCS, tools="crawl")
        assert await check_before(check, crawl, {"urls": ["https://docs.example/a"]}) == Allow()
        decision = await check_before(check, crawl, {"urls": ["https://docs.example/a", "https://evil.example/"]})
        assert isinstance(decision, Deny)
        assert "'evil.example'" in decision.message
        assert isinstance(await check_before(check, crawl, {"urls": [], "proxy": "http://proxy.evil/"}), Deny)
        assert await check_before(check, fetcher([]), {"url": "https://evil.example/"}) == Allow()

    @pytest.mark.parametrize(
        ("kwargs", "culprit"),
        [
            ({"fields": [], "hosts": DOCS}, "fields"),
            ({"fields": "url", "hosts": []}, "hosts"),
            ({"fields": "url", "hosts": ["https://docs.example/"]}, "not a host name"),
            ({"fields": "url", "hosts": DOCS, "tools": []}, "tools"),
            ({"fields": "url", "hosts": DOCS, "name": 3}, "name"),
            ({"fields": "url", "hosts": DOCS, "mandatory": None}, "mandatory"),
        ],
    )
    def test_bad_configuration_is_refused_when_built(self, kwargs: dict[str, Any], culprit: str) -> None:
        """Each bad argument raises ConfigurationError naming it."""
        with pytest.raises(ConfigurationError, match=culprit):
            HostAllowList(**kwargs)

    def test_name_and_mandatory_are_what_the_gate_reads(self) -> None:
        """The defaults, and both overridable."""
        assert (HostAllowList("u", DOCS).name, HostAllowList("u", DOCS).mandatory) == ("host-allow-list", False)
        custom = HostAllowList("u", DOCS, name="egress", mandatory=True)
        assert (custom.name, custom.mandatory) == ("egress", True)
