"""The ids the router gives requests that bring none: 24 hex digits, unique, and a
forked worker does not repeat its parent's; and how it reads a client's own."""

from __future__ import annotations

import os
import re

import pytest

from llmgw.router.request.call import new_request_id, request_id
from llmgw.testing.forwarder import reply
from tests.unit.router_world import World


class TestRequestIds:
    """Request ids the router makes are 24 hex digits and never repeat."""

    def test_ids_are_24_hex_digits_and_do_not_repeat(self) -> None:
        """Ids are 24 hex digits and do not repeat."""
        ids = [new_request_id() for _ in range(10_000)]
        assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
        assert len(set(ids)) == len(ids)

    def test_a_forked_child_makes_other_ids_than_its_parent(self) -> None:
        """A forked child makes other ids than its parent."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next ids, to the parent
            try:
                os.write(write, " ".join(new_request_id() for _ in range(5)).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            child = f.read().split()
        os.waitpid(pid, 0)
        parent = [new_request_id() for _ in range(5)]
        assert len(child) == 5
        assert not set(child) & set(parent)


class TestClientRequestIds:
    """A client's x-request-id is taken as one line, without the blanks around it."""

    @pytest.mark.parametrize(
        ("given", "taken"),
        [
            ("rq-1", "rq-1"),
            ("rq-1  ", "rq-1"),
            ("\trq 1\t ", "rq 1"),
            ("a\tb", "a\tb"),
            ("é-1", "é-1"),
        ],
    )
    def test_blanks_around_it_are_trimmed(self, given: str, taken: str) -> None:
        """Spaces and tabs at its ends are not the id's (HTTP's optional whitespace)."""
        assert taken == request_id(given)

    @pytest.mark.parametrize("given", [None, "", "   ", "\t", "a\nb", "a\r"])
    def test_blank_or_several_lines_get_a_new_one(self, given: str | None) -> None:
        """None, a blank one, or one of several lines: an id of the router's own."""
        assert re.fullmatch(r"[0-9a-f]{24}", request_id(given))

    @pytest.mark.parametrize("given", ["id-\udcff", "a\x85b", "a\u2028b", "a\x7fb"])
    def test_not_text_gets_a_new_one(self, given: str) -> None:
        """Bytes that are not UTF-8 (surrogates), or a character that is not printable:
        an id of the router's own (the trace exporter cannot encode the first)."""
        assert re.fullmatch(r"[0-9a-f]{24}", request_id(given))

    def test_the_engine_and_the_answer_get_it_trimmed(self) -> None:
        """Sent with trailing blanks, the id reaches the engine and comes back without them."""
        w = World('endpoints: [{id: a, url: "http://10.0.0.1:8000", models: [m]}]\n')
        w.fake.script("a", reply(200))

        async def main() -> object:
            return await w.send(headers={"x-request-id": "rq-1 \t "})

        got = w.run(main)
        assert (got.status, got.headers["x-request-id"]) == (200, "rq-1")
        assert w.fake.calls[0].headers["x-request-id"] == "rq-1"
