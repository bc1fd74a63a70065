"""`dashboard.ui.fit_widths`: the column widths that keep a table's last column on screen."""

from __future__ import annotations

from dashboard.ui import PAGE_WIDTH_PX, fit_widths


class TestFitWidths:
    def test_columns_that_fit_keep_their_natural_widths(self) -> None:
        """Short columns are as wide as their longest text, and their sum is within the budget."""
        widths = fit_widths({"tool": ["tool", "get_order"], "denied": ["denied", "12"]}, PAGE_WIDTH_PX)
        assert widths["tool"] > widths["denied"]
        assert sum(widths.values()) <= PAGE_WIDTH_PX

    def test_the_widest_columns_give_way_to_fit_the_budget(self) -> None:
        """A long message and a long id are cut to one common width; the sum is the budget at most."""
        texts = {
            "time": ["time (UTC)", "2026-12-04 23:39:36"],
            "message": ["message", "x" * 400],
            "call_id": ["call id", "c" * 64],
            "tool": ["tool", "get_order"],
        }
        widths = fit_widths(texts, 480, whole={"time"})
        assert sum(widths.values()) <= 480
        assert widths["message"] == widths["call_id"] < fit_widths(texts, 10_000)["call_id"]
        assert widths["tool"] == fit_widths(texts, 10_000)["tool"]

    def test_columns_kept_whole_are_not_cut(self) -> None:
        """A time column stays as wide as its text while the others are cut."""
        texts = {"time": ["time", "2026-12-04 23:39:36"], "a": ["a", "a" * 200], "b": ["b", "b" * 200]}
        assert fit_widths(texts, 400, whole={"time"})["time"] == fit_widths(texts, 10_000)["time"]
