"""sim-engine faults and the request validation that precedes them."""

from __future__ import annotations

from unittest import mock

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from llmgw.simengine import api
from llmgw.simengine.app import build_app
from llmgw.simengine.config import SimConfig
from llmgw.simengine.debug import is_loopback, loopback_only
from llmgw.simengine.faults import FaultConfig, FaultPatch, Faults, Verdict

CFG = SimConfig(model="m", served_model_names=("m", "alias"), num_gpu_blocks=100, max_model_len=64)


class TestFaults:
    """The sim-engine's injected faults and how they are set."""

    def test_no_faults_serves(self) -> None:
        """With the defaults every request is served."""
        f = Faults(FaultConfig())
        assert {f.admit() for _ in range(50)} == {Verdict.SERVE}

    def test_fail_rate_one_fails_all(self) -> None:
        """fail_rate 1.0 fails every request."""
        f = Faults(FaultConfig(fail_rate=1.0))
        assert {f.admit() for _ in range(50)} == {Verdict.FAIL}

    def test_fail_rate_is_a_fraction(self) -> None:
        """fail_rate 0.3 fails about 30% of requests (seeded, so exactly reproducible)."""
        f = Faults(FaultConfig(fail_rate=0.3), seed=1)
        fails = sum(f.admit() is Verdict.FAIL for _ in range(1000))
        assert 250 < fails < 350

    def test_crash_after_requests(self) -> None:
        """crash_after_requests 2 serves two requests and crashes on the third."""
        f = Faults(FaultConfig(crash_after_requests=2))
        assert [f.admit() for _ in range(3)] == [Verdict.SERVE, Verdict.SERVE, Verdict.CRASH]

    def test_setting_crash_restarts_the_count(self) -> None:
        """A crash count set at run time counts from then on."""
        f = Faults(FaultConfig())
        for _ in range(5):
            f.admit()
        f.update(FaultPatch(crash_after_requests=1))
        assert [f.admit(), f.admit()] == [Verdict.SERVE, Verdict.CRASH]

    def test_patch_keeps_unset_and_clears_none(self) -> None:
        """Keys not given keep their value; null clears a count."""
        f = Faults(FaultConfig(fail_rate=0.5, stall_after_tokens=3))
        new = f.update(msgspec.json.decode(b'{"stall_after_tokens": null}', type=FaultPatch))
        assert (new.fail_rate, new.stall_after_tokens) == (0.5, None)

    def test_invalid_patch_changes_nothing(self) -> None:
        """A rate outside [0, 1] is refused and the old settings stay."""
        f = Faults(FaultConfig(fail_rate=0.1))
        with pytest.raises(ValueError, match="fail_rate"):
            f.update(FaultPatch(fail_rate=2.0, stall_after_tokens=1))
        assert f.config == FaultConfig(fail_rate=0.1)

    def test_unknown_key_is_refused(self) -> None:
        """A typo in a fault name is an error, not a silent no-op."""
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(b'{"fail_rat": 1}', type=FaultPatch)


def error_of(call: object) -> tuple[int, dict[str, object]]:
    try:
        assert callable(call)
        call()
    except api.SimApiError as exc:
        return exc.status, msgspec.json.decode(exc.body())["error"]
    raise AssertionError("no error")


class TestValidation:
    """Request validation before any fault applies."""

    def chat(self, body: bytes) -> tuple[int, dict[str, object]]:
        return error_of(lambda: api.parse_chat(body, CFG))

    def test_malformed_json(self) -> None:
        """Malformed JSON is a 400 BadRequestError with the integer code."""
        status, err = self.chat(b"{nope")
        assert (status, err["type"], err["code"], err["param"]) == (
            400,
            "BadRequestError",
            400,
            None,
        )

    def test_missing_model(self) -> None:
        """A body without model is a 400 naming the model parameter."""
        status, err = self.chat(b'{"messages": []}')
        assert (status, err["param"]) == (400, "model")

    def test_unknown_model(self) -> None:
        """An unknown model is vLLM's 404 NotFoundError."""
        status, err = self.chat(b'{"model": "x", "messages": []}')
        assert (status, err["type"], err["message"]) == (
            404,
            "NotFoundError",
            "The model `x` does not exist.",
        )

    def test_alias_is_served(self) -> None:
        """Every --served-model-name is accepted and echoed back."""
        assert api.parse_chat(b'{"model": "alias", "messages": []}', CFG).model == "alias"

    def test_negative_max_tokens(self) -> None:
        """max_tokens below 1 is a 400."""
        status, err = self.chat(b'{"model": "m", "messages": [], "max_tokens": -1}')
        assert (status, err["param"]) == (400, "max_tokens")

    def test_prompt_longer_than_context(self) -> None:
        """A prompt that does not fit max_model_len is a 400 naming the limit."""
        body = msgspec.json.encode(
            {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
        )
        status, err = self.chat(body)
        assert status == 400
        assert "maximum context length is 64 tokens" in str(err["message"])

    def test_max_tokens_beyond_context(self) -> None:
        """Prompt plus max_tokens over the context is a 400."""
        status, _ = self.chat(b'{"model": "m", "messages": [], "max_tokens": 100}')
        assert status == 400

    def test_wrong_type(self) -> None:
        """A field of the wrong type is a 400 that says where."""
        status, err = self.chat(b'{"model": "m", "messages": [], "max_tokens": "3"}')
        assert status == 400
        assert "max_tokens" in str(err["message"])

    def test_bad_completion_prompt(self) -> None:
        """A completions prompt that is not text or ids is a 400."""
        status, _ = error_of(lambda: api.parse_completion(b'{"model": "m", "prompt": 5}', CFG))
        assert status == 400

    def test_default_max_tokens_fill_the_context(self) -> None:
        """Without max_tokens a chat may use the rest of the context."""
        job = api.parse_chat(b'{"model": "m", "messages": []}', CFG)
        assert job.max_tokens == 64 - len(job.prompt_ids)


class TestLoopbackOnly:
    """The fault endpoint answers loopback peers only."""

    @pytest.mark.parametrize(
        ("remote", "ok"),
        [("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.5", False)],
    )
    def test_is_loopback(self, remote: str, ok: bool) -> None:
        """Loopback means 127.0.0.0/8 and ::1, including IPv4-mapped forms."""
        assert is_loopback(remote) is ok

    async def test_other_peers_get_403(self) -> None:
        """/sim/ routes refuse a non-loopback peer with vLLM's error shape."""
        app = build_app(CFG)
        transport = mock.Mock()
        transport.get_extra_info.return_value = ("10.1.2.3", 5555)
        request = make_mocked_request("GET", "/sim/state", app=app, transport=transport)

        async def handler(_r: web.Request) -> web.StreamResponse:
            return web.Response(text="secret")

        resp = await loopback_only(request, handler)
        assert isinstance(resp, web.Response)
        assert resp.status == 403
        assert resp.body is not None
        assert msgspec.json.decode(resp.body)["error"]["code"] == 403  # type: ignore[arg-type]


class TestFailAnswer:
    """The status and Retry-After of an injected failure."""

    def test_default_is_500_without_retry_after(self) -> None:
        """By default fail_rate answers 500 and adds no header."""
        assert Faults(FaultConfig()).fail_answer() == (500, {})

    def test_status_and_retry_after(self) -> None:
        """fail_status and retry_after_s shape the failure answer."""
        f = Faults(FaultConfig(fail_rate=1.0))
        f.update(FaultPatch(fail_status=429, retry_after_s=7))
        assert f.fail_answer() == (429, {"Retry-After": "7"})
        f.update(FaultPatch(retry_after_s=None))
        assert f.fail_answer() == (429, {})

    @pytest.mark.parametrize("status", [200, 404, 428, 600])
    def test_fail_status_must_be_429_or_5xx(self, status: int) -> None:
        """A fail_status that is neither 429 nor 5xx is refused, and nothing changes."""
        f = Faults(FaultConfig())
        with pytest.raises(ValueError, match="fail_status"):
            f.update(FaultPatch(fail_status=status))
        assert f.config.fail_status == 500

    def test_negative_retry_after_refused(self) -> None:
        """retry_after_s must not be negative."""
        with pytest.raises(ValueError, match="retry_after_s"):
            FaultConfig(retry_after_s=-1).validate()


class TestLoopErrorAfterSteps:
    """An injected loop error after a number of steps."""

    def test_raises_after_n_steps(self) -> None:
        """loop_error_after_steps 2 lets two steps pass and raises on the third."""
        f = Faults(FaultConfig(loop_error_after_steps=2))
        f.step()
        f.step()
        with pytest.raises(RuntimeError, match="loop_error_after_steps"):
            f.step()

    def test_setting_it_restarts_the_count(self) -> None:
        """Setting it at run time counts from then on; None disables it."""
        f = Faults(FaultConfig())
        for _ in range(5):
            f.step()
        f.update(FaultPatch(loop_error_after_steps=1))
        f.step()
        with pytest.raises(RuntimeError):
            f.step()
        f.update(FaultPatch(loop_error_after_steps=None))
        f.step()
