"""Log formats: text as before, JSON one object per line with kv fields as keys."""

from __future__ import annotations

import json
import logging

import pytest

from llmgw.runtime.logs import JsonFormatter, LogFormatError, TextFormatter, kv, take_format


def record(msg: object, *args: object) -> logging.LogRecord:
    return logging.LogRecord("llmgw.x", logging.WARNING, __file__, 1, msg, args or None, None)


class TestKv:
    """The text log format is unchanged."""

    def test_text_unchanged(self) -> None:
        """The text format writes the event and its fields as before."""
        assert kv("engine exited", replica="r-1", code=3) == "engine exited replica=r-1 code=3"
        assert kv("plain") == "plain"


class TestTextFormat:
    """The text format writes each record on one line, whatever its values hold."""

    def test_line_feed_in_a_field_is_escaped(self) -> None:
        """A line feed, carriage return or ESC in a kv field is written as its escape."""
        fmt = TextFormatter("%(levelname)s %(message)s")
        line = fmt.format(record(kv("request", path="/v1/x\r\nINFO forged\x1b[2J")))
        assert line == 'WARNING request path="/v1/x\\r\\nINFO forged\\x1b[2J"'

    def test_percent_style_argument_is_escaped(self) -> None:
        """A %-style argument's line separators (Unicode's too) are escaped."""
        fmt = TextFormatter("%(message)s")
        line = fmt.format(record("refused path=%s", "/a\u2028b\x85c\td"))
        assert line == "refused path=/a\\u2028b\\x85c\\td"

    def test_printable_text_unchanged(self) -> None:
        """Printable text without spaces, backslashes and non-ASCII letters included, is
        written as it is."""
        fmt = TextFormatter("%(message)s")
        assert fmt.format(record(kv("x", name="é\\n/ok"))) == "x name=é\\n/ok"

    def test_a_value_that_would_forge_fields_is_quoted(self) -> None:
        """A value holding a space or a quote is quoted (logfmt), its quotes and
        backslashes escaped, so it cannot pass for fields of its own; `=` alone or an
        empty value stays bare."""
        line = kv("request", request_id='a status=200 k="v\\"', status=404, key="", r="A=0")
        assert line == 'request request_id="a status=200 k=\\"v\\\\\\"" status=404 key= r=A=0'

    def test_traceback_keeps_its_lines(self) -> None:
        """A traceback still follows the message on lines of its own."""
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
        text = TextFormatter("%(message)s").format(rec)
        assert text.splitlines()[0] == "failed"
        assert text.splitlines()[-1] == "ValueError: boom"


class TestJson:
    """The JSON log format: one object per line with fields as keys."""

    def test_fields_become_keys(self) -> None:
        """Fields become JSON keys beside event, level and logger, on one line."""
        line = JsonFormatter().format(record(kv("engine exited", replica="r-1", code=3)))
        doc = json.loads(line)
        assert doc["event"] == "engine exited"
        assert doc["replica"] == "r-1"
        assert doc["code"] == 3
        assert doc["level"] == "warning"
        assert doc["logger"] == "llmgw.x"
        assert "\n" not in line

    def test_percent_style_message(self) -> None:
        """A %-style message is formatted before it becomes the event."""
        doc = json.loads(JsonFormatter().format(record("serving name=%s port=%d", "router", 8)))
        assert doc["event"] == "serving name=router port=8"

    def test_traceback_stays_on_one_line(self) -> None:
        """Traceback stays on one line."""
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
        line = JsonFormatter().format(rec)
        assert "\n" not in line
        assert "ValueError: boom" in json.loads(line)["exc"]


class TestTakeFormat:
    """The log format taken from the flag or the environment."""

    def test_flag_removed_from_argv(self) -> None:
        """--log-format is taken out of argv in both spellings."""
        assert take_format(["--port", "1", "--log-format", "json"]) == ("json", ["--port", "1"])
        assert take_format(["--log-format=text", "x"]) == ("text", ["x"])

    def test_environment_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """LLMGW_LOG_FORMAT sets the default, and text is the default without it."""
        monkeypatch.setenv("LLMGW_LOG_FORMAT", "json")
        assert take_format([]) == ("json", [])
        monkeypatch.delenv("LLMGW_LOG_FORMAT")
        assert take_format([]) == ("text", [])

    @pytest.mark.parametrize("argv", [["--log-format", "xml"], ["--log-format"], ["--log-format="]])
    def test_bad_values(self, argv: list[str]) -> None:
        """An unknown or missing --log-format value is a LogFormatError."""
        with pytest.raises(LogFormatError, match="--log-format"):
            take_format(argv)
