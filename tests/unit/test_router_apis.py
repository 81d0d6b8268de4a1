"""The passed-through APIs' pure parts: conversation keys, forms, Anthropic errors, usage."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.router.apis import anthropic, catalog, conversation, forms
from llmgw.router.apis import usage as apiusage
from llmgw.router.apis.passthrough import _form_doc
from llmgw.router.request import inband
from llmgw.router.routing.affinity import route_key
from llmgw.wire.answerusage import Usage

SYSTEM = "be brief " * 30
TURNS = [
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "answer"},
    {"role": "user", "content": "second"},
]


class TestConversationKey:
    """Conversation keys and session hints in each API."""

    def test_same_conversation_same_key_in_each_api(self) -> None:
        """Chat, Responses (string, parts) and Messages (string, blocks) of one
        conversation hash to the same chain."""
        chat = route_key(
            {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, *TURNS]}, None
        )
        parts = [
            {
                "type": "message",
                "role": t["role"],
                "content": [{"type": "input_text", "text": t["content"]}],
            }
            for t in TURNS
        ]
        blocks = [
            {"role": t["role"], "content": [{"type": "text", "text": t["content"]}]} for t in TURNS
        ]
        keys = [
            conversation.responses_key(
                {"model": "m", "instructions": SYSTEM, "input": TURNS}, None
            ),
            conversation.responses_key(
                {"model": "m", "instructions": SYSTEM, "input": parts}, None
            ),
            conversation.messages_key({"model": "m", "system": SYSTEM, "messages": TURNS}, None),
            conversation.messages_key(
                {"model": "m", "system": [{"type": "text", "text": SYSTEM}], "messages": blocks},
                None,
            ),
        ]
        assert chat.hashes
        assert [k.hashes for k in keys] == [chat.hashes] * 4

    def test_string_input_is_a_user_turn(self) -> None:
        """A Responses `input` string is the user message chat would send."""
        chat = route_key({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, None)
        assert conversation.responses_key({"model": "m", "input": "hi"}, None).hashes == chat.hashes

    def test_session_hints(self) -> None:
        """Responses' `user` and Anthropic's metadata.user_id are the session hint."""
        r = conversation.responses_key({"model": "m", "input": "hi", "user": "u1"}, None)
        m = conversation.messages_key(
            {"model": "m", "messages": TURNS, "metadata": {"user_id": "u1"}}, None
        )
        assert r.session is not None
        assert m.session == r.session

    @pytest.mark.parametrize("kind", [[], {}, ["text"], {"a": 1}])
    def test_a_part_typed_by_a_container_is_kept_as_it_is(self, kind: object) -> None:
        """A part whose `type` is an array or object (unhashable) is an opaque part of
        the key, in content and in Anthropic's system blocks alike, never an exception."""
        part = {"type": kind, "text": "x"}
        items = [{"role": "user", "content": [part]}]
        got = [
            conversation.messages_key({"model": "m", "messages": items}, None),
            conversation.messages_key({"model": "m", "system": [part], "messages": []}, None),
            conversation.responses_key({"model": "m", "input": items}, None),
        ]
        assert all(k.hashes for k in got)


class TestForms:
    """Fields found in multipart forms."""

    BODY = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\nRIFF\r\n--XyZ-not\r\n"
        b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="stream"\r\n\r\ntrue\r\n--XyZ--\r\n'
    )

    def test_fields_found_past_a_file(self) -> None:
        """The model and stream fields are read after a file part holding a near-boundary."""
        got = forms.text_fields(
            self.BODY, 'multipart/form-data; boundary="XyZ"', ("model", "stream")
        )
        assert got == {"model": "whisper", "stream": "true"}

    @pytest.mark.parametrize(
        ("ctype", "body", "why"),
        [
            ("application/json", b"{}", "multipart/form-data"),
            ("multipart/form-data", b"x", "boundary"),
            ("multipart/form-data; boundary=b", b"nothing", "no part"),
            ("multipart/form-data; boundary=b", b"--b\r\nname", "end of headers"),
            ("multipart/form-data; boundary=b", b"--b\r\n\r\nvalue", "closing boundary"),
        ],
    )
    def test_malformed(self, ctype: str, body: bytes, why: str) -> None:
        """A body that is not the form it claims raises FormError saying why."""
        with pytest.raises(forms.FormError, match=why):
            forms.text_fields(body, ctype, ("model",))


def part(disposition: bytes, value: bytes, *extra: bytes) -> bytes:
    """One part of a form with boundary `b`, its headers `Content-Disposition` and `extra`."""
    head = b"\r\n".join((b"Content-Disposition: " + disposition, *extra))
    return b"--b\r\n" + head + b"\r\n\r\n" + value + b"\r\n"


CLOSE = b"--b--\r\n"
MODEL = b'form-data; name="model"'
FILE = part(b'form-data; name="file"; filename="a.wav"', b"RIFF")


class TestFormsAsTheEngineReadsThem:
    """The router reads a form's fields as the engine will, or refuses it as ambiguous."""

    def read(self, body: bytes) -> dict[str, str]:
        return forms.text_fields(body, "multipart/form-data; boundary=b", ("model", "stream"))

    @pytest.mark.parametrize(
        ("body", "why"),
        [
            (part(MODEL, b"a") + part(MODEL, b"b") + FILE + CLOSE, "more than one `model`"),
            (
                part(MODEL, b"a") + FILE + part(b"form-data; name=model", b"b") + CLOSE,
                "more than one `model`",
            ),
            (part(b'form-data; name="model"; name="x"', b"a") + CLOSE, "more than one name"),
            (part(b"form-data; name*=UTF-8''model", b"a") + CLOSE, "name\\*"),
            (part(MODEL, b"a", b'Content-Disposition: form-data; name="x"') + CLOSE, "two"),
            (part(b'form-data; name="model', b"a") + CLOSE, "Content-Disposition"),
            (part(MODEL, b"\xff\xfe") + CLOSE, "UTF-8"),
            (part(b'form-data; name="mo\\del"', b"a") + CLOSE, "backslash"),
            (part(MODEL, b"YQ==", b"Content-Transfer-Encoding: base64") + CLOSE, "encoded"),
            (part(MODEL + b'; filename="m.txt"', b"a") + FILE + CLOSE, "`model` .* is a file"),
            (
                part(MODEL, b"a") + part(b'form-data; name="stream"; filename=""', b"true") + CLOSE,
                "`stream` .* is a file",
            ),
            (part(MODEL + b"; filename*=UTF-8''m", b"a") + CLOSE, "`model` .* is a file"),
        ],
    )
    def test_ambiguous_forms_are_refused(self, body: bytes, why: str) -> None:
        """A field the router reads given twice (engines take the last, the router read the
        first), a part named twice, an extended name, two dispositions, an unclosed quote,
        a value not UTF-8 or transfer-encoded, a name with a backslash (engines unescape it
        differently), a read field sent as a file (a filename, even empty: the engine reads
        a file, not the model): FormError saying why, never a guess."""
        with pytest.raises(forms.FormError, match=why):
            self.read(body)

    def test_a_semicolon_inside_quotes_does_not_split(self) -> None:
        """`;` inside a quoted parameter is its text: a part the engine names `model` is
        read as the model, one whose quoted filename says `name=model` is not."""
        smuggled = part(b'form-data; filename="; name=model"; name="zzz"', b"a")
        hidden = part(b'form-data; foo="; name=x"; name="model"', b"b")
        assert self.read(smuggled + hidden + CLOSE) == {"model": "b"}

    def test_a_boundary_needs_its_line_end(self) -> None:
        """`--b` followed by anything but CRLF or `--` is file content, not a delimiter: a
        part hidden behind it is not read."""
        inside = b"--b\r\n" + b'Content-Disposition: form-data; name="file"\r\n\r\n'
        inside += b'x\r\n--bX\r\nContent-Disposition: form-data; name="model"\r\n\r\na\r\n'
        assert self.read(inside + part(MODEL, b"b") + CLOSE) == {"model": "b"}

    def test_one_boundary_only(self) -> None:
        """A Content-Type naming two boundaries is refused (the engine's parser keeps the
        last, and a body can hold a form under each); a quoted one may hold `;`."""
        body = part(MODEL, b"a") + CLOSE
        with pytest.raises(forms.FormError, match="more than one boundary"):
            forms.text_fields(body, "multipart/form-data; boundary=b; boundary=c", ("model",))
        quoted = body.replace(b"--b", b"--b;c")
        ctype = 'multipart/form-data; boundary="b;c"'
        assert forms.text_fields(quoted, ctype, ("model",)) == {"model": "a"}

    def test_a_backslash_in_a_filename_is_kept(self) -> None:
        """A Windows path as a filename is no ambiguity: the fields are read."""
        path = part(b'form-data; name="file"; filename="C:\\clips\\a.wav"', b"RIFF")
        assert self.read(path + part(MODEL, b"a") + CLOSE) == {"model": "a"}


class TestAnthropicErrors:
    """Errors reshaped for the Anthropic API."""

    def test_openai_error_reshaped(self) -> None:
        """An OpenAI-shaped error becomes Anthropic's, typed by its status."""
        body = b'{"error":{"message":"no such model","type":"invalid_request_error"}}'
        got = msgspec.json.decode(anthropic.reshape(404, body))
        assert got == {
            "type": "error",
            "error": {"type": "not_found_error", "message": "no such model"},
        }

    def test_anthropic_error_kept_and_text_wrapped(self) -> None:
        """An error already in Anthropic's shape is kept; plain text becomes the message."""
        mine = anthropic.error_body(429, "slow down")
        assert anthropic.reshape(429, mine) == mine
        got = msgspec.json.decode(anthropic.reshape(502, b"Bad Gateway"))
        assert got["error"] == {"type": "api_error", "message": "Bad Gateway"}

    def test_key_from_x_api_key(self) -> None:
        """x-api-key wins over Authorization, as a bearer value."""
        assert (
            anthropic.authorization({"x-api-key": "k", "Authorization": "Bearer o"}) == "Bearer k"
        )
        assert anthropic.authorization({"Authorization": "Bearer o"}) == "Bearer o"


class TestApiUsage:
    """Token usage read from each API's answers."""

    def test_responses(self) -> None:
        """A Responses answer's and its completed event's usage read the same."""
        u = b'{"usage":{"input_tokens":7,"output_tokens":3,'
        u += b'"input_tokens_details":{"cached_tokens":4}}}'
        want = Usage(prompt=7, completion=3, cached=4, cached_reported=4)
        assert apiusage.responses_usage(u) == want
        assert (
            apiusage.responses_usage(b'{"type":"response.completed","response":' + u + b"}") == want
        )

    def test_anthropic_stream_merged(self) -> None:
        """A Messages stream's usage is message_start's input side and message_delta's output."""
        s = apiusage.AnthropicStreamUsage()
        s.read(
            b'{"type":"message_start","message":{"usage":{"input_tokens":5,"cache_read_input_tokens":2}}}'
        )
        got = s.read(b'{"type":"message_delta","usage":{"output_tokens":9}}')
        assert got == Usage(prompt=7, completion=9, cached=2, cached_reported=2)

    def test_a_usage_without_counts_is_none(self) -> None:
        """A Responses or Messages usage that counts nothing is no usage, not zeros."""
        assert apiusage.responses_usage(b'{"usage":{"total_tokens":9}}') is None
        assert apiusage.responses_usage(b'{"response":{"usage":{}}}') is None
        assert apiusage.anthropic_usage(b'{"usage":{}}') is None
        assert apiusage.AnthropicStreamUsage().read(b'{"message":{"usage":{}}}') is None

    def test_counts_stop_at_the_reports_bound(self) -> None:
        """Counts past 2**53, alone or summed into a Messages prompt, are read as 2**53."""
        huge = b"1" + b"0" * 400
        top = Usage(prompt=2**53, completion=2**53, cached=0)
        doc = b'{"usage":{"input_tokens":' + huge + b',"output_tokens":' + huge + b"}}"
        assert apiusage.responses_usage(doc) == top
        three = b'{"usage":{"input_tokens":%d,"cache_read_input_tokens":%d,' % (2**53, 2**53)
        three += b'"cache_creation_input_tokens":%d,"output_tokens":1}}' % 2**53
        got = apiusage.anthropic_usage(three)
        assert got == Usage(prompt=2**53, completion=1, cached=2**53, cached_reported=2**53)


class TestAnthropicErrorFrame:
    """Engine failures seen in an Anthropic messages stream."""

    def test_engine_failure_seen_in_a_messages_stream(self) -> None:
        """An engine's Anthropic `event: error` frame is its failure (the type says 5xx)."""
        watch = inband.ErrorFrameWatch(inband.ANTHROPIC_MARK)
        watch.feed(b'event: message_start\ndata: {"type":"message_start"}\n\n')
        watch.feed(b'event: error\ndata: {"type":"error","error":{"type":"api_error",')
        watch.feed(b'"message":"boom"}}\n\n')
        assert (watch.code, watch.message) == (500, "boom")
        assert watch.endpoint_failure is True

    def test_client_error_type_is_not_a_failure(self) -> None:
        """An invalid_request_error frame is seen but is not the endpoint's failure."""
        watch = inband.ErrorFrameWatch(inband.ANTHROPIC_MARK)
        frame = b'data: {"type":"error","error":{"type":"invalid_request_error","message":"x"}}\n'
        watch.feed(b"event: error\n" + frame)
        assert watch.seen is True
        assert watch.endpoint_failure is False


RESPONSES_TEXT = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"item_id":"msg_1","output_index":0,"content_index":0,"delta":"hi","sequence_number":5}\n\n'
)
RESPONSES_ERROR = (
    b'event: error\ndata: {"type":"error","code":"server_error","message":"boom",'
    b'"param":null,"sequence_number":6}\n\n'
)


def responses_watch(*chunks: bytes) -> inband.ErrorFrameWatch:
    """The watch a Responses stream gets (the route's own marks), fed `chunks`."""
    api = catalog.RESPONSES
    watch = inband.ErrorFrameWatch(api.error_mark, also=api.error_also)
    for chunk in chunks:
        watch.feed(chunk)
    return watch


class TestResponsesErrorFrame:
    """Engine failures seen in a Responses stream."""

    def test_error_event_is_the_engines_failure(self) -> None:
        """The Responses API's `error` event (code and message at its top level) with
        code server_error is the endpoint's failure, as a 500."""
        watch = responses_watch(RESPONSES_TEXT, RESPONSES_ERROR)
        assert (watch.code, watch.message, watch.endpoint_failure) == (500, "boom", True)

    def test_openai_error_frame_still_seen(self) -> None:
        """An engine that writes OpenAI's `{"error": {...}}` frame in a Responses stream
        is still seen failing."""
        frame = b'data: {"error":{"message":"oom","type":"InternalServerError","code":500}}\n\n'
        watch = responses_watch(RESPONSES_TEXT, frame)
        assert (watch.code, watch.message, watch.endpoint_failure) == (500, "oom", True)

    def test_client_code_is_seen_not_a_failure(self) -> None:
        """An `error` event with a code that is not the engine's failure is seen only."""
        frame = RESPONSES_ERROR.replace(b"server_error", b"invalid_prompt")
        watch = responses_watch(RESPONSES_TEXT, frame)
        assert (watch.seen, watch.endpoint_failure) == (True, False)

    def test_every_split_point(self) -> None:
        """Wherever one chunk ends and the next begins, the event is found."""
        stream = RESPONSES_TEXT + RESPONSES_ERROR
        for i in range(len(stream) + 1):
            assert responses_watch(stream[:i], stream[i:]).endpoint_failure, i

    def test_error_event_with_its_type_last(self) -> None:
        """The event in the openai package's field order (code first, type last), as an
        engine that serializes that type writes it, is the failure too, at any split."""
        frame = (
            b'event: error\ndata: {"code":"server_error","message":"boom","param":null,'
            b'"sequence_number":6,"type":"error"}\n\n'
        )
        assert responses_watch(RESPONSES_TEXT, frame).code == 500
        stream = RESPONSES_TEXT + frame
        for i in range(len(stream) + 1):
            assert responses_watch(stream[:i], stream[i:]).endpoint_failure, i

    def test_chat_streams_are_not_watched_for_the_code_mark(self) -> None:
        """A chat stream's watch keeps its one mark: an event opening with `code` there
        is no error frame."""
        watch = inband.ErrorFrameWatch(catalog.MESSAGES.error_mark)
        watch.feed(b'data: {"code":"server_error","type":"error"}\n\n')
        assert not watch.seen
        chat = inband.ErrorFrameWatch()
        chat.feed(b'data: {"code":"server_error","type":"error"}\n\n')
        assert not chat.seen


class TestFormStream:
    """An upload's `stream` counted as vLLM reads it (wire/formbool.py, tested there)."""

    @pytest.mark.parametrize(("text", "streams"), [("True", True), ("1", True), ("no", False)])
    def test_an_upload_streams_as_the_engine_reads_it(self, text: str, streams: bool) -> None:
        """An upload with `stream=True` or `1` counts as a stream, as vLLM answers it."""
        body = part(MODEL, b"m") + part(b'form-data; name="stream"', text.encode()) + CLOSE
        doc = _form_doc(body, "multipart/form-data; boundary=b")
        assert {"model": "m", "stream": streams} == doc
