"""Errors of the event contract (a leaf module: imports nothing of the project)."""

from __future__ import annotations


class EventError(Exception):
    """Root of the events package's errors."""


class EventParseError(EventError):
    """Wire bytes that are not a valid event of a known type and a supported schema version.

    `reason` says what is wrong in a few words (the consumer dead-letters the message with it);
    `raw` keeps the input as given, never lost.
    """

    def __init__(self, reason: str, raw: bytes | str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
