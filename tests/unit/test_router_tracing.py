"""The trace context the router passes on to an engine (router/request/tracing.py)."""

from __future__ import annotations

from multidict import CIMultiDict

from llmgw.router.request.tracing import as_came, context_of, passed_on

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


class TestContextOf:
    """A client's trace headers read as W3C Trace Context says."""

    def test_one_of_each(self) -> None:
        """One traceparent and one tracestate come back as sent."""
        assert context_of(CIMultiDict([("traceparent", TP), ("tracestate", "a=1")])) == (TP, "a=1")

    def test_traceparent_twice_is_none(self) -> None:
        """Two traceparent headers are no context at all: which one was meant is unknown."""
        other = TP.replace("00f067aa0ba902b7", "1111111111111111")
        headers = CIMultiDict([("traceparent", TP), ("traceparent", other), ("tracestate", "a=1")])
        assert context_of(headers) == (None, None)
        assert as_came(headers) == b""

    def test_tracestate_lines_joined(self) -> None:
        """Several tracestate lines are one list, every member kept in order."""
        headers = CIMultiDict([("traceparent", TP), ("tracestate", "a=1"), ("tracestate", "b=2")])
        assert as_came(headers) == f"traceparent: {TP}\r\ntracestate: a=1,b=2\r\n".encode()

    def test_none(self) -> None:
        """No traceparent: nothing passed on, a lone tracestate neither."""
        assert as_came(CIMultiDict([("tracestate", "a=1")])) == b""
