"""The tests' one wait helper (llmgw.testing.wait): poll until a condition holds."""

from __future__ import annotations

import itertools

import pytest

from llmgw.testing import until, wait_until


class TestWaitUntil:
    """The blocking wait returns the first truthy value or fails naming what it awaited."""

    def test_returns_the_first_truthy_value(self) -> None:
        """The check's first truthy result is returned, after the falsy ones."""
        values = iter([None, 0, [], "ready"])
        assert wait_until(lambda: next(values), timeout_s=5, every_s=0) == "ready"

    def test_timeout_names_what_and_the_last_value(self) -> None:
        """A check that never holds fails with what was awaited and what was last seen."""
        with pytest.raises(AssertionError, match=r"not within 0.05s: the node; last seen \[\]"):
            wait_until(list, timeout_s=0.05, what="the node", every_s=0.01)

    def test_what_may_describe_the_state_at_the_timeout(self) -> None:
        """A function given as `what` is called once the wait has timed out, not before."""
        checks: list[None] = []
        described: list[int] = []

        def describe() -> str:
            described.append(len(checks))
            return "the state then"

        with pytest.raises(AssertionError, match=r"not within 0\.05s: the state then; last seen"):
            wait_until(lambda: checks.append(None), timeout_s=0.05, every_s=0.01, what=describe)
        assert described == [len(checks)]

    def test_ignored_exceptions_are_not_yet_and_others_propagate(self) -> None:
        """An ignored exception means "not yet"; another one ends the wait at once."""
        calls = itertools.count()

        def starting() -> int:
            if next(calls) < 2:
                raise ConnectionRefusedError
            return 7

        assert wait_until(starting, timeout_s=5, every_s=0, ignore=(OSError,)) == 7
        with pytest.raises(KeyError):
            wait_until(lambda: {}["x"], timeout_s=5, ignore=(OSError,))


class TestUntil:
    """The awaiting wait takes plain, coroutine and blocking checks."""

    async def test_plain_and_coroutine_checks(self) -> None:
        """A plain check and a coroutine function both give their truthy value."""
        values = iter([False, True])
        assert await until(lambda: next(values), timeout_s=5, every_s=0) is True

        async def check() -> str:
            return "done"

        assert await until(check, timeout_s=5) == "done"

    async def test_blocking_check_runs_in_a_thread(self) -> None:
        """With blocking, the check runs off the event loop's thread."""
        import threading

        loop_thread = threading.get_ident()
        seen = await until(threading.get_ident, timeout_s=5, blocking=True)
        assert seen != loop_thread

    async def test_timeout_shows_the_last_exception(self) -> None:
        """The timeout message carries the last ignored exception."""

        def refused() -> None:
            raise ConnectionRefusedError("port 9")

        with pytest.raises(AssertionError, match="port 9"):
            await until(refused, timeout_s=0.05, every_s=0.01, ignore=(OSError,))
