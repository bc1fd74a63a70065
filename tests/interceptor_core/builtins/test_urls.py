"""`host_in` and `HostAllowList`: the tricks that make a URL's host look like another, each tried."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interceptor_core import ConfigurationError, Deny, Gate, tool
from interceptor_core.builtins import HostAllowList, host_in
from interceptor_core.decisions import Allow
from interceptor_core.testing import check_before

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
            "https://user:pass@docs.example/",
            "https://evil.example%2F@docs.example/",
            "HTTPS://DOCS.EXAMPLE/",
            "https://docs.example./",
            "https://docs.example:443/",
            "https://docs.example:/",
            "//docs.example/x",
            "https:///docs.example/",
            "https:docs.example/",
            "  https://docs.example/  ",
            "\x00\x1f https://docs.example/ \x0c",
            "ht\ttps://docs.\nexample/",
            "https://%64ocs.example/",
            "https://docs.example\\path",
        ],
    )
    def test_the_allowed_host_in_its_many_spellings_is_allowed(self, url: str) -> None:
        """Case, trailing dot, ports, userinfo, slashes, controls, tabs and escapes do not hide the host."""
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
        """Userinfo, backslashes, fragments and lookalike suffixes reveal the real host."""
        assert not host_in(url, DOCS)

    @pytest.mark.parametrize(
        "url",
        [
            "https://docs.example%2F.evil.example/",
            "https://docs%00.example/",
            "https://docs%ff.example/",
            "https://docs .example/",
            "https://docs\x01.example/",
            "https://docs..example/",
            "https://a" + "b" * 64 + ".example/",
            "https://docs.example:99999/",
            "https://docs.example:44a/",
            "https://docs.example:-1/",
            "https://:443/",
            "https:///",
            "https://@/",
        ],
    )
    def test_a_host_that_is_no_valid_host_is_refused(self, url: str) -> None:
        """Escapes to forbidden characters, bad UTF-8, spaces, controls, empty labels and bad ports."""
        assert not host_in(url, [*DOCS, "evil.example"])

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
        assert host_in("https://A.Example.COM./", hosts)
        assert not host_in("https://example.com/", hosts)
        assert not host_in("https://badexample.com/", hosts)
        assert not host_in("https://example.com.evil.example/", hosts)
        assert not host_in("https://a.example.com@evil.example/", hosts)

    def test_unicode_hosts_are_compared_as_a_labels(self) -> None:
        """An entry and a URL match whether either is written in Unicode or as its xn-- A-label."""
        assert host_in("https://bücher.example/", ["bücher.example"])
        assert host_in("https://xn--bcher-kva.example/", ["bücher.example"])
        assert host_in("https://BÜCHER.example/", ["xn--bcher-kva.example"])
        assert host_in("https://%C3%BCber.example/", ["über.example"])

    def test_full_width_forms_fold_to_ascii(self) -> None:
        """Full-width letters and the ideographic full stop are the ASCII name, as browsers read them."""
        assert host_in("https://ｄｏｃｓ。example/", DOCS)
        assert not host_in("https://ｅｖｉｌ.example/", DOCS)

    def test_a_homoglyph_is_another_host(self) -> None:
        """A Cyrillic о in docs.example is a different A-label, so a different host."""
        assert not host_in("https://d\u043ecs.example/", DOCS)

    def test_characters_idna_versions_disagree_on_are_refused(self) -> None:
        """ß, ς, ZWJ and ZWNJ map differently across IDNA versions: a host holding one is refused."""
        assert not host_in("https://faß.example/", ["fass.example"])
        assert not host_in("https://fa%C3%9F.example/", ["fass.example"])
        with pytest.raises(ValueError, match="not a valid host"):
            host_in("https://fass.example/", ["faß.example"])

    def test_a_host_idna_cannot_encode_is_refused(self) -> None:
        """An unassigned or prohibited code point makes the URL hostless."""
        assert not host_in("https://docs\u0378.example/", DOCS)
        assert not host_in("https://\u2028docs.example/", DOCS)

    @pytest.mark.parametrize(
        "url",
        [
            "http://127.0.0.1/",
            "http://127.0.0.1./",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0X7F000001/",
            "http://0x7f.1/",
            "http://127.1/",
            "http://127.0.1/",
            "http://0177.0.0.1/",
            "http://0177.0.0.01/",
            "http://%31%32%37.0.0.1/",
            "http://１２７.0.0.1/",
            "http://user@127.1:8080/",
        ],
    )
    def test_ipv4_shorthand_is_the_address_it_stands_for(self, url: str) -> None:
        """Decimal, hex and octal parts, one to four of them, all reach 127.0.0.1, as entry or not."""
        assert host_in(url, ["127.0.0.1"])
        assert not host_in(url, DOCS)

    @pytest.mark.parametrize(
        "url", ["http://1.2.3.4.5/", "http://256.0.0.1/", "http://1.2.3.256/", "http://4294967296/", "http://09.1.1.1/"]
    )
    def test_a_host_ending_in_a_number_that_is_no_address_is_refused(self, url: str) -> None:
        """Too many parts, parts out of range, and non-octal digits after a leading 0 are invalid hosts."""
        assert not host_in(url, ["1.2.3.4", "docs.example"])

    def test_ipv4_entries_may_be_shorthand_too(self) -> None:
        """An entry is parsed like a URL's host, so `127.1` allows http://127.0.0.1/."""
        assert host_in("http://127.0.0.1/", ["127.1"])

    def test_ipv6_literals_compare_as_addresses(self) -> None:
        """Bracketed IPv6 in any spelling matches an entry bracketed or not; zone ids are refused."""
        assert host_in("http://[::1]/", ["::1"])
        assert host_in("http://[0:0:0:0:0:0:0:1]:8080/", ["[::1]"])
        assert host_in("http://[2001:DB8::1]/", ["2001:db8::1"])
        assert not host_in("http://[::2]/", ["::1"])
        assert not host_in("http://[::1%25eth0]/", ["::1"])
        assert not host_in("http://[::1/", ["::1"])
        assert not host_in("http://[::1]x/", ["::1"])
        assert not host_in("http://[not-an-ip]/", ["::1"])

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
    def test_shorthand_agrees_with_inet_aton(self, address: int, parts: int, forms: list[str]) -> None:
        """Any address, written in one to four parts of any base, is the address inet_aton reads."""
        octets = address.to_bytes(4, "big")
        numbers = [*octets[: parts - 1], int.from_bytes(octets[parts - 1 :], "big")]
        host = ".".join(_ipv4_part(number, form) for number, form in zip(numbers, forms, strict=False))
        dotted = socket.inet_ntoa(socket.inet_aton(host))
        assert dotted == socket.inet_ntoa(octets)
        assert host_in(f"http://{host}/", [dotted])


def fetcher(seen: list[str]) -> Any:
    @tool
    def fetch(url: str) -> str:
        """Fetches a URL."""
        seen.append(url)
        return "page"

    return fetch


class TestHostAllowList:
    async def test_through_a_gate_another_host_is_denied_before_the_tool_runs(self) -> None:
        """The denial names the tool, the argument and the host seen, never the URL's credentials."""
        seen: list[str] = []
        desk = Gate("g", interceptors=[HostAllowList("url", ["docs.example", "*.docs.example"])]).agent(
            "a", tools=[fetcher(seen)]
        )
        denied = await desk.call("fetch", {"url": "https://docs.example:hunter2@evil.example/x"})
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

    async def test_a_url_without_a_host_is_denied_without_being_quoted(self) -> None:
        """A file: URL has no host to allow; the denial says so."""
        decision = await check_before(HostAllowList("url", DOCS), fetcher([]), {"url": "file:///etc/passwd"})
        assert isinstance(decision, Deny)
        assert "not an http, https, ws or wss URL with a host" in decision.message
        assert "/etc/passwd" not in decision.message

    async def test_the_host_seen_is_shown_normalized(self) -> None:
        """IPv4 shorthand is shown as the address, IPv6 in brackets, names as A-labels."""
        check = HostAllowList("url", DOCS)
        for url, shown in [
            ("http://0x7f.1/", "'127.0.0.1'"),
            ("http://[::1]/", "'[::1]'"),
            ("https://bücher.example/", "'xn--bcher-kva.example'"),
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
