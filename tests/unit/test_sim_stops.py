"""sim-engine stop strings: found as the text grows, in the request's order."""

from __future__ import annotations

from llmgw.simengine.stops import StopScan


class TestStopScan:
    """Where a reply's text ends, token by token."""

    def test_found_across_tokens(self) -> None:
        """A stop string spanning two tokens is found when the second comes; the reply ends
        before it."""
        scan = StopScan(("d fo",), include=False)
        assert scan.feed("the ") is None
        assert scan.feed("and ") is None
        assert scan.feed("for ") == ("d fo", 6)

    def test_include_keeps_the_stop_string(self) -> None:
        """With include_stop_str_in_output the kept text ends after the stop string."""
        scan = StopScan(("an",), include=True)
        scan.feed("the ")
        assert scan.feed("and ") == ("an", 6)
        assert scan.holdback == 0

    def test_first_in_the_request_order_wins(self) -> None:
        """Two stop strings in one token: the one listed first ends the reply, as vLLM's."""
        scan = StopScan(("d ", "an"), include=False)
        assert scan.feed("and ") == ("d ", 2)

    def test_not_checked_is_not_found_later(self) -> None:
        """A stop string completed while not checked (min_tokens) is never reported."""
        scan = StopScan(("the",), include=False)
        assert scan.feed("the ", check=False) is None
        assert scan.feed("and ") is None

    def test_holdback_is_the_longest_less_one(self) -> None:
        """A stream holds back one character less than the longest stop string."""
        assert StopScan(("a", "abcd"), include=False).holdback == 3
