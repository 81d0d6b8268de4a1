"""Token counts from engine usage: JSON answers and event streams split anywhere."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.request.tokens import StreamUsage, Usage, counted, usage_of
from llmgw.wire.answerusage import Doc
from llmgw.wire.usage import MAX_COUNT


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}


class TestUsageOf:
    """Token usage in a whole JSON answer."""

    def test_answer_with_usage(self) -> None:
        """Usage in a whole answer gives prompt, completion and cached tokens."""
        body = json.dumps({"id": "x", "choices": [], "usage": USAGE}).encode()
        assert usage_of(body) == Usage(prompt=7, completion=3, cached=4, cached_reported=4)

    @pytest.mark.parametrize(
        "body",
        [b"{}", b'{"usage": null}', b'not json with "usage"', b'{"usage": 5}', b""],
    )
    def test_no_usable_usage(self, body: bytes) -> None:
        """An answer without a usable usage object gives None."""
        assert usage_of(body) is None

    def test_missing_details_count_zero_cached(self) -> None:
        """Missing details count zero cached."""
        body = b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1}}'
        assert usage_of(body) == Usage(prompt=2, completion=1, cached=0, cached_reported=None)

    @pytest.mark.parametrize(
        "usage", [b"{}", b'{"total_tokens": 9}', b'{"prompt_tokens_details": {"cached_tokens": 2}}']
    )
    def test_a_usage_without_counts_is_none(self, usage: bytes) -> None:
        """A usage with neither a prompt nor a completion count is no usage, not zeros."""
        assert usage_of(b'{"usage": ' + usage + b"}") is None

    def test_one_count_is_enough(self) -> None:
        """An embeddings answer's usage, a prompt count and no completion, is a usage."""
        body = b'{"usage": {"prompt_tokens": 4, "total_tokens": 4}}'
        assert usage_of(body) == Usage(prompt=4, completion=0, cached=0)

    def test_counts_stop_at_the_reports_bound(self) -> None:
        """A count past a float's range (10**400) is read as 2**53, never as itself."""
        huge = "1" + "0" * 400
        body = f'{{"usage": {{"prompt_tokens": {huge}, "completion_tokens": -4}}}}'.encode()
        assert usage_of(body) == Usage(prompt=MAX_COUNT, completion=0, cached=0)
        assert float(MAX_COUNT) == MAX_COUNT


class TestStreamUsage:
    """Token usage in an event stream split anywhere."""

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
        """A stream without a usage object gives None, whatever its text says."""
        scan = StreamUsage()
        scan.feed(event({"choices": [{"delta": {"content": "usage"}}]}))
        assert scan.usage is None


def _reference(body: bytes) -> Usage | None:
    """usage_of as the whole document decoded (what the search from the end must equal)."""
    try:
        u = msgspec.json.decode(body, type=Doc).usage
    except msgspec.DecodeError:
        return None
    return None if u is None else counted(u)


_usage_values = st.one_of(
    st.none(),
    st.integers(-3, 99),
    st.just("usage"),
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": st.none() | st.integers(-3, 10**6),
            "completion_tokens": st.none() | st.integers(-3, 10**6) | st.just("x"),
            "prompt_tokens_details": st.none()
            | st.fixed_dictionaries({}, optional={"cached_tokens": st.integers(-3, 99)}),
        },
    ),
)
# Values that hide "usage" where it is not the answer's own: nested keys at any depth,
# in lists, as string values.
_json = st.recursive(
    st.none() | st.integers(-5, 5) | st.sampled_from(["usage", '"usage":', "x"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["usage", "a", "choices"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def _answers(draw: st.DrawFn) -> bytes:
    doc: dict[str, object] = {}
    for key in draw(st.permutations(["id", "choices", "usage", "extra"])):
        if key == "usage":
            if draw(st.booleans()):
                doc["usage"] = draw(_usage_values)
        else:
            doc[key] = draw(_json)
    layout = draw(st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 1}]))
    text = json.dumps(doc, **layout)  # type: ignore[arg-type]
    return text.encode() + draw(st.sampled_from([b"", b"\n", b" x"]))


class TestUsageFromTheEnd:
    """Usage read from the end of an answer matches a full decode."""

    @settings(max_examples=400)
    @given(_answers())
    def test_same_as_decoding_the_whole_answer(self, body: bytes) -> None:
        """Decoding from the last "usage" finds what decoding the whole answer does: the
        answer's own usage wherever it sits, nothing from a nested or quoted one."""
        assert usage_of(body) == _reference(body)

    def test_a_nested_usage_after_the_answer_s_own(self) -> None:
        """A nested usage after the answer's own."""
        body = b'{"usage":{"prompt_tokens":2},"extra":{"usage":{"prompt_tokens":9}}}'
        assert usage_of(body) == Usage(prompt=2, completion=0, cached=0)
        assert usage_of(b'{"object":"usage"}') is None
        assert usage_of(b'{"usage" : {"prompt_tokens" : 4}}') == Usage(
            prompt=4, completion=0, cached=0
        )
