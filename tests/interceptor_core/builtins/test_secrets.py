"""`has_secrets` and `NoSecrets`: secrets the audit redactor knows, wherever they sit in a value."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
from typing import Any

import pytest
from pydantic import BaseModel

from events.redaction import DEFAULT_SECRET_KEYS, Redactor, RegexDetector
from interceptor_core import ConfigurationError, Deny, Gate, tool
from interceptor_core.builtins import NoSecrets, has_secrets
from interceptor_core.decisions import Allow
from interceptor_core.testing import check_before

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n"
    "-----END RSA PRIVATE KEY-----"
)
CARD = 4111111111111111


class Profile(BaseModel):
    name: str
    note: str


@dataclasses.dataclass
class Settings:
    region: str
    key: str


class TestHasSecrets:
    def test_an_aws_key_deep_in_a_nested_list_is_found(self) -> None:
        """A key three containers down is still a secret."""
        assert has_secrets({"config": [{"env": ["PATH=/bin", f"AWS_ACCESS_KEY_ID={AWS_KEY}"]}]})

    def test_a_jwt_is_found(self) -> None:
        """A JSON web token inside prose is a secret."""
        assert has_secrets(f"use this session: {JWT} thanks")

    def test_a_private_key_block_is_found(self) -> None:
        """A PEM private key is a secret."""
        assert has_secrets({"attachment": PRIVATE_KEY})

    def test_a_card_number_is_found_as_an_int_and_as_grouped_text(self) -> None:
        """A Luhn-valid card number is a secret whether sent as an int, a float or spaced digits."""
        assert has_secrets(CARD)
        assert has_secrets({"amount": 12, "card": CARD})
        assert has_secrets("card 4111 1111 1111 1111 exp 12/29")
        assert has_secrets(4111111111111111.0)

    def test_a_number_that_is_no_card_is_clean(self) -> None:
        """A Luhn-invalid 16-digit number and ordinary numbers are not secrets."""
        assert not has_secrets(4111111111111112)
        assert not has_secrets([1, 2.5, 10**30, -7])

    def test_a_clean_value_is_clean(self) -> None:
        """Ordinary arguments hold no secret."""
        assert not has_secrets({"to": "ops@example.com", "subject": "Weekly report", "count": 3, "tags": ["a", "b"]})
        assert not has_secrets(None)
        assert not has_secrets("")

    def test_a_secret_in_a_key_is_found(self) -> None:
        """Mapping keys are text too: a key that is itself a token is a secret."""
        assert has_secrets({AWS_KEY: "value"})
        assert has_secrets({"outer": {JWT: 1}})
        assert has_secrets({CARD: "x"})

    def test_a_secret_named_key_with_a_value_is_a_secret(self) -> None:
        """As the redactor does, a value under `password`, `api_key` or `Authorization` is secret, at any depth."""
        assert has_secrets({"password": "hunter2"})
        assert has_secrets({"db": {"X-Api-Key": "abc"}})
        assert has_secrets([{"Authorization": "whatever"}])
        assert has_secrets({"cvv": 123})
        assert has_secrets({"credentials": {"user": "bob"}})

    def test_a_secret_named_key_with_nothing_under_it_is_clean(self) -> None:
        """None, booleans, blank strings and empty containers under a secret-named key reveal nothing."""
        assert not has_secrets({"password": None, "api_key": "", "token": "   ", "secret": [], "cookie": {}})
        assert not has_secrets({"credentials": {"user": ""}, "use_token": False})

    def test_a_secret_named_counter_counts_unless_the_redactor_is_narrowed(self) -> None:
        """`max_tokens` matches the word `token`; a redactor without that word lets it through."""
        assert has_secrets({"max_tokens": 100})
        narrowed = Redactor(secret_keys=[word for word in DEFAULT_SECRET_KEYS if word != "token"])
        assert not has_secrets({"max_tokens": 100}, redactor=narrowed)
        assert has_secrets({"password": "x"}, redactor=narrowed)

    def test_the_redactor_given_decides(self) -> None:
        """Its detectors and secret keys are the ones used; a disabled or empty redactor finds nothing."""
        internal = Redactor(extra_detectors=[RegexDetector("ticket", r"TCK-[0-9]{6}")])
        assert has_secrets({"note": "see TCK-123456"}, redactor=internal)
        assert not has_secrets({"note": "see TCK-123456"})
        assert not has_secrets({"password": "x", "key": AWS_KEY}, redactor=Redactor.none())
        assert not has_secrets({"key": AWS_KEY}, redactor=Redactor(enabled=False))

    def test_models_dataclasses_sets_and_bytes_are_looked_inside(self) -> None:
        """What a pydantic model, a dataclass, a set or bytes holds is scanned."""
        assert has_secrets(Profile(name="x", note=f"key {AWS_KEY}"))
        assert has_secrets(Settings(region="eu", key=AWS_KEY))
        assert has_secrets({"keys": {AWS_KEY}})
        assert has_secrets(AWS_KEY.encode())
        assert not has_secrets(Profile(name="x", note="nothing"))

    def test_a_cycle_and_deep_nesting_are_scanned_without_raising(self) -> None:
        """A list holding itself ends; a value nested past the recursion limit is still scanned."""
        cyclic: list[Any] = ["clean"]
        cyclic.append(cyclic)
        assert not has_secrets(cyclic)
        deep: Any = AWS_KEY
        for _ in range(5000):
            deep = [deep]
        assert has_secrets(deep)

    def test_a_value_that_cannot_be_looked_at_counts_as_a_secret(self) -> None:
        """An object whose str() raises fails closed."""

        class Opaque:
            def __str__(self) -> str:
                raise RuntimeError("no")

        assert has_secrets({"thing": Opaque()})

    def test_a_failing_detector_fails_closed(self) -> None:
        """A detector that raises makes the value count as holding a secret."""

        class Broken:
            name = "broken"

            def find(self, text: str) -> list[tuple[int, int]]:
                raise RuntimeError("detector bug")

        assert has_secrets("anything", redactor=Redactor(detectors=[Broken()]))


class TestHardToRead:
    """What a plain scan misses: invisible characters, encodings, assignments, splits (the corpus
    holds many more cases; these name each rule once)."""

    def test_nul_or_a_lone_surrogate_is_refused_whatever_the_redactor(self) -> None:
        """The policy engine cannot hold such a string whole, so the function refuses it too."""
        assert has_secrets("ab\x00cd")
        assert has_secrets({"note\x00": "x"})
        assert has_secrets(["fine", "half \ud83d of an emoji"])
        assert has_secrets("ab\x00cd", redactor=Redactor(enabled=False))
        assert not has_secrets("ab\x01cd \u200b \U0001f600")

    def test_invisible_and_look_alike_characters_are_dropped_or_mapped(self) -> None:
        """A zero-width space, a combining mark, Cyrillic letters or full-width digits hide nothing."""
        assert has_secrets("AKIAIOSFOD\u200bNN7EXAMPLE")
        assert has_secrets("A\u0301KIAIOSFODNN7EXAMPLE")
        assert has_secrets("\u0410\u041aI\u0410IOSFODNN7EXAMPLE")
        assert has_secrets("card \uff14\uff11\uff11\uff11 1111 1111 1111")

    @pytest.mark.parametrize("blank", ["\u3164", "\uffa0", "\u115f", "\u1160", "\u2800"])
    def test_letters_drawn_as_nothing_are_dropped(self, blank: str) -> None:
        """Hangul fillers and the blank Braille pattern are letters or symbols, not format characters,
        yet show nothing: inside a key they hide nothing."""
        assert has_secrets(f"AKIAIOSFOD{blank}NN7EXAMPLE")

    def test_unicode_dashes_between_card_groups_are_separators(self) -> None:
        """A non-breaking hyphen, an en dash or a minus sign joins card groups as '-' does."""
        for dash in ("\u2011", "\u2013", "\u2212"):
            assert has_secrets(dash.join(["card 4111", "1111", "1111", "1111"]))

    @pytest.mark.parametrize("width", [1, 4, 8])
    def test_base64_wrapped_in_short_lines_is_read_across_them(self, width: int) -> None:
        """Base64 of a key, a few characters per line, is one run across the lines."""
        encoded = base64.b64encode(AWS_KEY.encode()).decode()
        assert has_secrets("\n".join(encoded[at : at + width] for at in range(0, len(encoded), width)))

    def test_a_secret_key_name_in_look_alike_letters_is_the_key_name(self) -> None:
        """A full-width or Cyrillic `password` map key marks its value as `password` does."""
        assert has_secrets({"\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44": "x9!Kq2#mZ"})
        assert has_secrets({"p\u0430ssword": "x9!Kq2#mZ"})

    def test_card_numbers_with_other_separators_are_found_but_dotted_addresses_are_not_cards(self) -> None:
        """Dots, slashes and spaced dashes between digit groups; a list of addresses stays clean."""
        assert has_secrets("card 4111.1111.1111.1111")
        assert has_secrets("card 4111 / 1111 / 1111 / 1111")
        assert not has_secrets("hosts 10.0.0.1 10.0.0.2 192.168.100.200 192.168.100.201")

    def test_encoded_secrets_are_decoded_and_random_ids_are_not_secrets(self) -> None:
        """Base64, hex and percent-encoding of a key are found; digests in them are not secrets."""
        assert has_secrets(base64.b64encode(AWS_KEY.encode()).decode())
        assert has_secrets(AWS_KEY.encode().hex())
        assert has_secrets("".join(f"%{byte:02X}" for byte in AWS_KEY.encode()))
        assert not has_secrets(hashlib.sha256(b"x").hexdigest())
        assert not has_secrets(base64.b64encode(hashlib.sha256(b"x").digest()).decode())

    def test_a_value_whose_decodings_outgrow_the_bound_fails_closed(self) -> None:
        """Base64 of a gzip bomb cannot be looked at whole; gzip of a short clean text can."""
        assert has_secrets(base64.b64encode(gzip.compress(bytes(2 << 20))).decode())
        assert not has_secrets(base64.b64encode(gzip.compress(b"a clean note about order 1234")).decode())

    def test_a_credential_after_a_key_name_is_a_secret_a_word_or_placeholder_is_not(self) -> None:
        """`pwd=`, `password:` with a credential-like value count; prose, types and variables do not."""
        assert has_secrets("connect with pwd=Hunter2xyz!")
        assert has_secrets("password: hunter2")
        assert has_secrets({"pwd": "Hunter2xyz!"})
        assert not has_secrets("Password: must be 12 characters")
        assert not has_secrets("password=${DB_PASSWORD}, api_key: str | None")
        assert not has_secrets({"pwd": "/home/alice"})

    def test_words_matched_by_a_detector_are_no_secret(self) -> None:
        """ "Bearer <token>" and prose about bearer tokens pass; a real bearer token does not."""
        assert not has_secrets("send Authorization: Bearer <token>; the proxy reads a bearer token")
        assert has_secrets("Authorization: Bearer abcDEF123456ghiJKL789")

    def test_a_secret_split_across_values_is_found_in_either_order(self) -> None:
        """List items and mapping entries are joined: in order, with blanks, and backwards."""
        assert has_secrets(["AKIAIOSF", "ODNN7EXAMPLE"])
        assert has_secrets({"a": "ODNN7EXAMPLE", "b": "AKIAIOSF"})
        assert has_secrets({"value": "Authorization: Bearer", "other": "abcDEF123456ghiJKL789"})

    def test_a_key_written_in_groups_or_over_lines_is_found_but_glued_words_are_no_token(self) -> None:
        """Blanks inside a key hide nothing; prose glued together ("eyJumped...") is not a JWT."""
        assert has_secrets("AKIA IOSF ODNN 7EXA MPLE")
        assert has_secrets("the key is AKIAIOSFOD\nNN7EXAMPLE, thanks")
        assert not has_secrets("they Jumped over the fence. It was 2026")

    def test_digits_glued_across_values_are_not_taken_for_a_card(self) -> None:
        """Two numeric ids side by side are no card number, even when their digits pass Luhn."""
        assert not has_secrets({"a": "4111 1111", "b": "1111 1111"})
        assert not has_secrets(["1234567", "1000123", "4111111", "111111111"])


def messenger(seen: list[dict[str, str]]) -> Any:
    @tool
    def send_message(to: str, body: str, subject: str = "") -> str:
        """Sends a message."""
        seen.append({"to": to, "body": body})
        return "sent"

    return send_message


class TestNoSecrets:
    async def test_through_a_gate_a_secret_is_denied_without_being_repeated(self) -> None:
        """The tool does not run; the denial names tool and argument, never the secret."""
        seen: list[dict[str, str]] = []
        desk = Gate("g", interceptors=[NoSecrets()]).agent("a", tools=[messenger(seen)])
        denied = await desk.call("send_message", {"to": "ops@example.com", "body": f"the key is {AWS_KEY}"})
        assert denied.kind == "denied"
        assert seen == []
        message = denied.message or ""
        assert "send_message" in message
        assert "'body'" in message
        assert AWS_KEY not in message
        assert "AKIA" not in message
        allowed = await desk.call("send_message", {"to": "ops@example.com", "body": "all clear"})
        assert allowed.kind == "ok"
        assert len(seen) == 1

    async def test_every_argument_holding_a_secret_is_named(self) -> None:
        """Two arguments with secrets are both listed."""
        decision = await check_before(NoSecrets(), messenger([]), {"to": JWT, "body": PRIVATE_KEY})
        assert isinstance(decision, Deny)
        assert "arguments 'to', 'body' hold" in decision.message
        assert JWT not in decision.message
        assert "PRIVATE KEY" not in decision.message

    async def test_a_secret_split_across_two_arguments_is_denied_naming_both(self) -> None:
        """Neither argument holds it alone; joined, they do, and the denial says so."""
        decision = await check_before(NoSecrets(), messenger([]), {"to": "AKIAIOSFOD", "body": "NN7EXAMPLE"})
        assert isinstance(decision, Deny)
        assert "arguments 'to', 'body' hold, joined together," in decision.message
        assert "NN7" not in decision.message
        narrowed = NoSecrets(fields=["body"])
        assert await check_before(narrowed, messenger([]), {"to": "AKIAIOSFOD", "body": "NN7EXAMPLE"}) == Allow()

    async def test_fields_limits_which_arguments_are_looked_at(self) -> None:
        """Only the named arguments are checked; a named one the tool lacks is skipped."""
        check = NoSecrets(fields=["body", "attachment"])
        assert await check_before(check, messenger([]), {"to": AWS_KEY, "body": "hi"}) == Allow()
        assert isinstance(await check_before(check, messenger([]), {"to": "x", "body": AWS_KEY}), Deny)

    async def test_argument_names_follow_the_secret_key_rule(self) -> None:
        """A tool argument called `password` holding a value is a secret; left empty it is not."""

        @tool
        def login(user: str, password: str = "") -> str:
            """Logs in."""
            return "ok"

        check = NoSecrets()
        decision = await check_before(check, login, {"user": "bob", "password": "hunter2"})
        assert isinstance(decision, Deny)
        assert "'password'" in decision.message
        assert "hunter2" not in decision.message
        assert await check_before(check, login, {"user": "bob"}) == Allow()

    async def test_only_matching_tools_are_checked(self) -> None:
        """A tool outside the globs passes with a secret."""
        check = NoSecrets(tools=["post_*", "upload"])
        assert await check_before(check, messenger([]), {"to": "x", "body": AWS_KEY}) == Allow()
        assert isinstance(
            await check_before(NoSecrets(tools="send_*"), messenger([]), {"to": "x", "body": AWS_KEY}), Deny
        )

    async def test_the_given_redactor_is_used(self) -> None:
        """A redactor with an extra detector makes its matches secrets here too."""
        check = NoSecrets(redactor=Redactor(extra_detectors=[RegexDetector("ticket", r"TCK-[0-9]{6}")]))
        assert isinstance(await check_before(check, messenger([]), {"to": "x", "body": "TCK-000001"}), Deny)
        assert await check_before(NoSecrets(), messenger([]), {"to": "x", "body": "TCK-000001"}) == Allow()

    @pytest.mark.parametrize(
        ("kwargs", "culprit"),
        [
            ({"fields": []}, "fields"),
            ({"fields": [None]}, "argument name"),
            ({"tools": []}, "tools"),
            ({"redactor": "default"}, "redactor"),
            ({"name": ""}, "name"),
            ({"mandatory": "no"}, "mandatory"),
        ],
    )
    def test_bad_configuration_is_refused_when_built(self, kwargs: dict[str, Any], culprit: str) -> None:
        """Each bad argument raises ConfigurationError naming it."""
        with pytest.raises(ConfigurationError, match=culprit):
            NoSecrets(**kwargs)

    def test_name_and_mandatory_are_what_the_gate_reads(self) -> None:
        """The defaults, and both overridable."""
        assert (NoSecrets().name, NoSecrets().mandatory) == ("no-secrets", False)
        custom = NoSecrets(name="dlp", mandatory=True)
        assert (custom.name, custom.mandatory) == ("dlp", True)
