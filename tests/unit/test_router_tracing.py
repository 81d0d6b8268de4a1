"""The trace context the router passes on to an engine (router/request/tracing.py)."""

from __future__ import annotations

from llmgw.router.request.tracing import passed_on

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class TestPassedOn:
    """The trace headers passed on to an engine."""

    def test_both_headers_as_lines(self) -> None:
        """traceparent and tracestate become the engine's header lines, unchanged."""
        assert passed_on(TP, "a=1,b=2") == f"traceparent: {TP}\r\ntracestate: a=1,b=2\r\n".encode()

    def test_tracestate_optional(self) -> None:
        """Without a tracestate only the traceparent goes on."""
        assert passed_on(TP, None) == f"traceparent: {TP}\r\n".encode()

    def test_line_breaks_dropped(self) -> None:
        """A value holding a line break would smuggle a header: it is not passed on."""
        assert passed_on(TP + "\r\nx-evil: 1", None) == b""
        assert passed_on(TP, "a=1\nx-evil: 1") == f"traceparent: {TP}\r\n".encode()
