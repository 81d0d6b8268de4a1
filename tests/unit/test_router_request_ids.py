"""The ids the router gives requests that bring none: 24 hex digits, unique, and a
forked worker does not repeat its parent's."""

from __future__ import annotations

import os
import re

from llmgw.router.request.call import new_request_id


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
