"""The final events that make a relayed stream complete (router/request/streamend.py)."""

from __future__ import annotations

import pytest

from llmgw.router.request.relay import event_end
from llmgw.router.request.streamend import final_event_sent

CHAT_END = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
MESSAGES_END = (
    b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":3}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
RESPONSES_END = (
    b'event: response.completed\ndata: {"response":{"id":"resp_1","status":"completed"},'
    b'"sequence_number":9,"type":"response.completed"}\n\n'
)


class TestFinalEventSent:
    """The final events that complete each API's stream, however framed."""

    @pytest.mark.parametrize("stream", [CHAT_END, MESSAGES_END, RESPONSES_END])
    def test_each_api_final_event(self, stream: bytes) -> None:
        """Each API's final event, whole, ends the stream."""
        assert final_event_sent(b"", stream) is True

    @pytest.mark.parametrize("stream", [CHAT_END, MESSAGES_END, RESPONSES_END])
    def test_split_over_two_chunks(self, stream: bytes) -> None:
        """A final event cut anywhere between the last two chunks is still seen."""
        for cut in range(1, len(stream)):
            assert final_event_sent(stream[:cut], stream[cut:]) is True

    @pytest.mark.parametrize("stream", [CHAT_END, MESSAGES_END, RESPONSES_END])
    def test_without_its_blank_line(self, stream: bytes) -> None:
        """An event without its blank line has not been dispatched by the client yet."""
        assert final_event_sent(b"", stream[:-1]) is False

    def test_crlf_framing(self) -> None:
        """CRLF line ends count as well as LF."""
        assert final_event_sent(b"", CHAT_END.replace(b"\n", b"\r\n")) is True

    def test_ordinary_events_do_not_end(self) -> None:
        """A token event, or a Messages stream before message_stop, is not the end."""
        assert final_event_sent(b"", b'data: {"choices":[]}\n\n') is False
        assert final_event_sent(b"", MESSAGES_END.split(b"event: message_stop")[0]) is False

    def test_text_that_mentions_the_marker(self) -> None:
        """Generated text holding `[DONE]` or the event's type (escaped in JSON) is not the end."""
        text = b'data: {"delta":"data: [DONE] \\"type\\":\\"message_stop\\""}\n\n'
        assert final_event_sent(b"", text) is False


class TestEventEnd:
    """What ends the event a broken stream left open before the router's error event."""

    @pytest.mark.parametrize(
        ("before", "sent", "pad"),
        [
            (b"", b"", b""),
            (b"", b"data: x\n\n", b""),
            (b"data: x\r\n", b"\r\n", b""),
            (b"data: x\n", b"\r", b""),
            (b"", b'data: {"id":"c","obj', b"\n\n"),
            (b"data: {", b"x", b"\n\n"),
            (b"", b"data: x\n", b"\n"),
            (b"data: x", b"\r\n", b"\n"),
            (b"", b"data: x\r", b"\n\n"),
        ],
    )
    def test_pad(self, before: bytes, sent: bytes, pad: bytes) -> None:
        """An event ended already needs nothing, a line left open two LFs, a line ended
        one; a CR last takes one LF more (it would join it as CRLF)."""
        assert pad == event_end(before, sent)

    def test_the_error_event_parses_after_a_cut(self) -> None:
        """Cut inside an event, the padded error frame is an event of its own."""
        cut = b'data: {"id":"c","object":"chat.compl'
        frame = b'data: {"error":{"message":"broke","code":502}}\n\n'
        events = (cut + event_end(b"", cut) + frame).split(b"\n\n")
        assert events[1] == frame.removesuffix(b"\n\n")
