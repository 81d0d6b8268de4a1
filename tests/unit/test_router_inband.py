"""The watch for an engine's own error event inside a relayed 200 stream."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.request.inband import (
    ANTHROPIC_MARK,
    MARK,
    MAX_FRAME_BYTES,
    MESSAGES_OPENERS,
    RESPONSES_MARK,
    RESPONSES_OPENERS,
    ErrorFrameWatch,
    nothing_before_error,
    openers_only,
    role_opener_only,
)

TOKEN = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"delta":{"content":"hi"}}]}\n\n'
)
VLLM_ERROR = (
    b'data: {"error": {"object": "error", "message": "CUDA out of memory", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def watch(*chunks: bytes) -> ErrorFrameWatch:
    w = ErrorFrameWatch()
    for c in chunks:
        w.feed(c)
    return w


class TestErrorFrameWatch:
    """The watch finds an engine's error event in a 200 stream however it is split."""

    def test_clean_stream_sees_nothing(self) -> None:
        """A stream of ordinary events has no error and no endpoint failure."""
        w = watch(TOKEN, TOKEN, DONE)
        assert (w.seen, w.endpoint_failure, w.code) == (False, False, None)

    def test_vllm_5xx_frame_is_an_endpoint_failure(self) -> None:
        """vLLM's mid-stream error event with code 500 counts against the endpoint."""
        w = watch(TOKEN, VLLM_ERROR, DONE)
        assert (w.endpoint_failure, w.code, w.message) == (True, 500, "CUDA out of memory")

    def test_4xx_frame_is_seen_but_not_a_failure(self) -> None:
        """An error event for the request itself (400) is not the endpoint's fault."""
        w = watch(b'data: {"error":{"message":"bad tool","type":"x","code":400}}\n\n', DONE)
        assert (w.seen, w.endpoint_failure, w.code) == (True, False, 400)

    def test_frame_as_the_first_line(self) -> None:
        """An error event that opens the stream is found (no newline before it)."""
        assert watch(VLLM_ERROR).endpoint_failure

    def test_no_space_after_data_and_crlf_lines(self) -> None:
        """`data:{"error"` without the optional space, on CRLF lines, is still a frame."""
        w = watch(TOKEN.replace(b"\n", b"\r\n"), b'data:{"error":{"message":"m","code":503}}\r\n')
        assert w.code == 503

    def test_code_given_as_a_string(self) -> None:
        """A code written as a numeric string is read as that number."""
        assert watch(b'data: {"error":{"message":"m","code":"502"}}\n\n').code == 502

    def test_a_code_no_int_can_be_made_of_is_no_code(self) -> None:
        """A code of digits `int()` refuses (a superscript two, 5,000 nines) is no code,
        and the frame is still seen."""
        for code in ("\u00b2", "9" * 5000):
            frame = '{"error":{"message":"m","code":"' + code + '"}}'
            w = watch(b"data: " + frame.encode() + b"\n\n")
            assert (w.seen, w.code) == (True, None)

    def test_tgi_string_error_has_no_code(self) -> None:
        """TGI's `{"error": "...", "error_type": ...}` is seen, with no code, so not counted."""
        w = watch(b'data:{"error":"Request failed during generation","error_type":"generation"}\n')
        assert (w.seen, w.code, w.endpoint_failure) == (True, None, False)

    def test_tgi_chat_frame_code_is_its_http_status_code(self) -> None:
        """TGI's chat error event names its status `http_status_code`; a 5xx one counts."""
        frame = b'data: {"error":{"message":"generation failed","http_status_code":500}}\n\n'
        w = watch(TOKEN, frame, DONE)
        assert (w.endpoint_failure, w.code, w.message) == (True, 500, "generation failed")

    def test_escaped_text_in_content_is_not_a_frame(self) -> None:
        """A model that writes `data: {"error"` in its output has it escaped in JSON: ignored."""
        ev = b'data: {"choices":[{"delta":{"content":"\\ndata: {\\"error\\": 1}"}}]}\n\n'
        assert not watch(ev, DONE).seen

    def test_error_key_inside_an_event_is_not_a_frame(self) -> None:
        """`{"error"` that does not open a `data:` line (a nested object) is ignored."""
        ev = b'data: {"choices":[],"meta":{"error":{"code":500}}}\n\n'
        assert not watch(ev, DONE).seen

    def test_only_the_first_frame_decides(self) -> None:
        """After one error event, later ones do not change the verdict."""
        w = watch(b'data: {"error":{"message":"a","code":400}}\n\n', VLLM_ERROR)
        assert w.code == 400

    def test_unterminated_huge_line_is_given_up(self) -> None:
        """A candidate line that never ends is dropped once over the bound, not buffered on."""
        w = watch(b'data: {"error":"' + b"x" * (MAX_FRAME_BYTES + 10))
        assert not w.seen
        assert w._pending is None

    @given(st.lists(st.integers(min_value=0, max_value=len(TOKEN + VLLM_ERROR + DONE))))
    def test_any_chunking_gives_the_same_verdict(self, cuts: list[int]) -> None:
        """Wherever the chunk boundaries fall (inside the marker, `data:`, the JSON), the
        verdict is the same as for the stream in one piece."""
        stream = TOKEN + VLLM_ERROR + DONE
        points = sorted({0, len(stream), *cuts})
        chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
        w = watch(*chunks)
        assert (w.code, w.endpoint_failure) == (500, True)

    def test_every_single_split_point(self) -> None:
        """Every two-piece split of a stream ending in an error event finds it."""
        stream = TOKEN + VLLM_ERROR + DONE
        for i in range(len(stream) + 1):
            assert watch(stream[:i], stream[i:]).endpoint_failure, i

    def test_byte_by_byte(self) -> None:
        """A stream fed one byte at a time still finds the frame."""
        stream = TOKEN + VLLM_ERROR
        w = watch(*(stream[i : i + 1] for i in range(len(stream))))
        assert w.code == 500


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
ERROR = b'data: {"error":{"message":"boom","code":500}}\n\n'


class TestNothingBeforeError:
    """Whether a stream sent output before its error event."""

    def test_error_first(self) -> None:
        """An error frame that opens the stream follows no output."""
        assert nothing_before_error(ERROR + b"data: [DONE]\n\n")

    def test_after_role_opener(self) -> None:
        """The chat role opener carries no token: an error right after it follows no output."""
        assert nothing_before_error(ROLE + ERROR)

    def test_after_a_token(self) -> None:
        """An error after a token event follows output."""
        assert not nothing_before_error(ROLE + TOKEN + ERROR)
        assert not nothing_before_error(TOKEN + ERROR)

    def test_no_error(self) -> None:
        """Bytes without an error frame are not an error before output."""
        assert not nothing_before_error(ROLE + TOKEN)


class TestRoleOpenerOnly:
    """Telling a role-only opener chunk from a token."""

    def test_opener(self) -> None:
        """The role opener alone, or nothing, holds no output."""
        assert role_opener_only(ROLE)
        assert role_opener_only(b"")

    def test_token(self) -> None:
        """A token event, alone or after the opener, is output."""
        assert not role_opener_only(TOKEN)
        assert not role_opener_only(ROLE + TOKEN)


def sse(kind: str, data: str) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"


M_START = sse("message_start", '{"type":"message_start","message":{"type":"message"}}')
M_BLOCK = sse(
    "content_block_start",
    '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
)
M_PING = sse("ping", '{"type":"ping"}')
M_DELTA = sse(
    "content_block_delta",
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ping"}}',
)
M_ERROR = sse("error", '{"type":"error","error":{"type":"api_error","message":"boom"}}')
R_OPEN = b"".join(
    sse(k, '{"type":"' + k + '","response":{"object":"response","output":[]}}')
    for k in ("response.created", "response.in_progress")
) + sse(
    "response.output_item.added", '{"item":{"type":"message"},"type":"response.output_item.added"}'
)
R_DELTA = sse("response.output_text.delta", '{"type":"response.output_text.delta","delta":"hi"}')
R_ERROR = sse("error", '{"type":"error","code":"server_error","message":"boom"}')


class TestOpenersOnly:
    """Telling a Messages or Responses stream's opening events from output."""

    def test_messages_openers(self) -> None:
        """message_start, content_block_start and ping carry no output; a delta does,
        even one whose text is an opener's name."""
        assert openers_only(M_START + M_BLOCK + M_PING, MESSAGES_OPENERS)
        assert not openers_only(M_START + M_BLOCK + M_DELTA, MESSAGES_OPENERS)
        assert not openers_only(M_DELTA, MESSAGES_OPENERS)

    def test_responses_openers_whatever_the_key_order(self) -> None:
        """Responses' opening events are known by their event line, or by their type
        wherever it sits in the JSON; a text delta is output."""
        assert openers_only(R_OPEN, RESPONSES_OPENERS)
        no_line = b'data: {"response":{},"sequence_number":0,"type":"response.created"}\n\n'
        assert openers_only(no_line, RESPONSES_OPENERS)
        assert not openers_only(R_OPEN + R_DELTA, RESPONSES_OPENERS)

    def test_an_event_cut_short_before_its_type_is_output(self) -> None:
        """An event whose bytes end before they name its type is not known to be an
        opener: the head is relayed, as it was before."""
        cut = M_START + b'event: content_block_delta\ndata: {"type":"content_bl'
        assert not openers_only(cut, MESSAGES_OPENERS)
        assert openers_only(M_START + b"event: ping\n", MESSAGES_OPENERS)

    def test_no_openers_is_chat(self) -> None:
        """Without openers the rule is chat's role opener."""
        assert openers_only(ROLE)
        assert not openers_only(ROLE + TOKEN)


class TestNothingBeforeErrorInOtherApis:
    """An error event right after a Messages or Responses stream's openers follows no output."""

    def test_messages(self) -> None:
        """After message_start and content_block_start: no output; after a delta: output."""
        marks = (ANTHROPIC_MARK,)
        assert nothing_before_error(M_START + M_BLOCK + M_ERROR, marks, MESSAGES_OPENERS)
        assert nothing_before_error(M_ERROR, marks, MESSAGES_OPENERS)
        assert not nothing_before_error(M_START + M_DELTA + M_ERROR, marks, MESSAGES_OPENERS)

    def test_responses_either_frame(self) -> None:
        """A Responses stream's error is its own event or OpenAI's frame, after the openers."""
        marks = (MARK, RESPONSES_MARK)
        assert nothing_before_error(R_OPEN + R_ERROR, marks, RESPONSES_OPENERS)
        assert nothing_before_error(R_OPEN + ERROR, marks, RESPONSES_OPENERS)
        assert not nothing_before_error(R_OPEN + R_DELTA + R_ERROR, marks, RESPONSES_OPENERS)

    def test_chat_mark_alone_misses_an_anthropic_error(self) -> None:
        """Chat's mark does not find Anthropic's event: the marks passed decide."""
        assert not nothing_before_error(M_START + M_ERROR)
