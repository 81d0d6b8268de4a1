"""Token counts from engine usage: JSON answers and event streams split anywhere."""

from __future__ import annotations

import json

import pytest

from llmgw.router.tokens import StreamUsage, Usage, usage_of


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}


class TestUsageOf:
    def test_answer_with_usage(self) -> None:
        body = json.dumps({"id": "x", "choices": [], "usage": USAGE}).encode()
        assert usage_of(body) == Usage(prompt=7, completion=3, cached=4, cached_reported=4)

    @pytest.mark.parametrize(
        "body",
        [b"{}", b'{"usage": null}', b'not json with "usage"', b'{"usage": 5}', b""],
    )
    def test_no_usable_usage(self, body: bytes) -> None:
        assert usage_of(body) is None

    def test_missing_details_count_zero_cached(self) -> None:
        body = b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1}}'
        assert usage_of(body) == Usage(prompt=2, completion=1, cached=0, cached_reported=None)


class TestStreamUsage:
    def stream(self) -> bytes:
        return (
            event({"choices": [{"delta": {"content": "a"}}], "usage": None})
            + event({"choices": [{"delta": {"content": "b"}}], "usage": None})
            + event({"choices": [], "usage": USAGE})
            + b"data: [DONE]\n\n"
        )

    @pytest.mark.parametrize("size", [1, 3, 7, 16, 1000])
    def test_split_anywhere(self, size: int) -> None:
        """The usage event is found however the stream is cut into chunks."""
        data = self.stream()
        scan = StreamUsage()
        for i in range(0, len(data), size):
            scan.feed(data[i : i + size])
        assert scan.usage == Usage(prompt=7, completion=3, cached=4, cached_reported=4)

    def test_last_usage_wins(self) -> None:
        """continuous_usage_stats: every event carries running totals; the last one counts."""
        scan = StreamUsage()
        scan.feed(event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}))
        scan.feed(event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}))
        assert scan.usage == Usage(prompt=7, completion=2, cached=0)

    def test_stream_without_usage(self) -> None:
        scan = StreamUsage()
        scan.feed(event({"choices": [{"delta": {"content": "usage"}}]}))
        assert scan.usage is None
