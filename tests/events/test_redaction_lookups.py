"""The Redactor's read-only lookups: what its detectors and its secret-key rule find, apart."""

from __future__ import annotations

import pytest

from events.redaction import Redactor, RegexDetector

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


class TestLookups:
    def test_detector_spans_are_the_content_detectors_alone(self) -> None:
        """A key found by a detector is a span; a value after a secret key name is not one of them."""
        text = f"key {AWS_KEY} and password=hunter2"
        redactor = Redactor()
        assert [text[start:end] for start, end in redactor.detector_spans(text)] == [AWS_KEY]
        assert [text[start:end] for start, end in redactor.key_value_spans(text)] == ["hunter2"]
        assert redactor.redact_text(text) == "key [REDACTED] and password=[REDACTED]"

    def test_key_value_spans_follow_the_configured_key_words(self) -> None:
        """Only the redactor's own words mark a value; without words, or disabled, nothing does."""
        text = "pwd=abc token=xyz"
        assert [text[s:e] for s, e in Redactor(secret_keys=["pwd"]).key_value_spans(text)] == ["abc"]
        assert Redactor(secret_keys=[]).key_value_spans(text) == []
        assert Redactor(enabled=False).key_value_spans(text) == []

    @pytest.mark.parametrize(
        ("key", "secret"),
        [("password", True), ("X-Api-Key", True), ("max_tokens", True), ("pwd", False), ("author", False)],
    )
    def test_is_secret_key_is_the_rule_applied_to_mapping_keys(self, key: str, secret: bool) -> None:
        """The same answer as redact_args gives for a key holding a value."""
        redactor = Redactor()
        assert redactor.is_secret_key(key) is secret
        assert bool(redactor.redact_args("t", {key: "v"}).redacted_paths) is secret

    def test_a_disabled_redactor_finds_nothing_and_says_so(self) -> None:
        """`enabled` is False and every lookup comes back empty."""
        disabled = Redactor(enabled=False)
        assert disabled.enabled is False
        assert Redactor().enabled is True
        assert disabled.detector_spans(AWS_KEY) == []
        assert disabled.is_secret_key("password") is False

    def test_detector_spans_raise_what_a_detector_raises(self) -> None:
        """Unlike redact_text, which fails closed, the lookup lets the caller decide."""

        class Broken:
            name = "broken"

            def find(self, text: str) -> list[tuple[int, int]]:
                raise RuntimeError("detector bug")

        with pytest.raises(RuntimeError, match="detector bug"):
            Redactor(detectors=[Broken()]).detector_spans("x")
        assert Redactor(detectors=[RegexDetector("t", "TCK")]).detector_spans("a TCK") == [(2, 5)]

    def test_digits_false_skips_the_card_detector_only(self) -> None:
        """A card number is not looked for; a key beside it still is."""
        text = f"4111 1111 1111 1111 {AWS_KEY}"
        redactor = Redactor()
        assert len(redactor.detector_spans(text)) == 2
        assert [text[start:end] for start, end in redactor.detector_spans(text, digits=False)] == [AWS_KEY]

    def test_may_match_is_false_only_when_no_detector_can_fire(self) -> None:
        """No anchor in the text: False; an anchor, or a detector without anchors: True."""
        redactor = Redactor()
        assert redactor.may_match(f"key {AWS_KEY}")
        assert not redactor.may_match("the quick brown fox")
        assert Redactor(extra_detectors=[RegexDetector("t", "TCK")]).may_match("the quick brown fox")
        assert not Redactor(enabled=False).may_match(AWS_KEY)
