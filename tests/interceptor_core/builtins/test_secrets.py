"""`has_secrets` and `NoSecrets`: secrets the audit redactor knows, wherever they sit in a value."""

from __future__ import annotations

import dataclasses
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
