"""The sim-engine as strict as a real engine (issue 34, item 8): every route but three behind
the engine key, and prompts counted before they are tokenized, so big refused bodies cost
neither a peak nor memory left behind. Real sim-engine processes on 127.0.0.1; memory from
/proc (VmHWM: the peak, VmRSS: now)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from llmgw.testing import start_program
from tests.integration.hostile import Answer, assert_openai_error, no_traceback, raw_request
from tests.integration.router_fixtures import sim_args

pytestmark = pytest.mark.timeout(120)

KEY = "sk-strict"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def request(method: str, path: str, body: bytes = b"", *, key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


# About 90 tokens: five full KV blocks of 16, so the prefix cache holds something.
COMPLETION = json.dumps(
    {"model": "m", "prompt": "the quick brown fox jumps over the lazy dog " * 8, "max_tokens": 2}
).encode()
# Every route the engine serves beyond the three open ones (with dev mode and sleep mode on).
GUARDED = [
    ("POST", "/reset_prefix_cache", b""),
    ("GET", "/sim/state", b""),
    ("GET", "/sim/cache", b""),
    ("POST", "/sim/faults", b"{}"),
    ("POST", "/sleep", b""),
    ("POST", "/wake_up", b""),
    ("GET", "/is_sleeping", b""),
    ("GET", "/v1/models", b""),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/chat/completions", b'{"model": "m", "messages": []}'),
    ("POST", "/v1/embeddings", b'{"model": "m", "input": "x"}'),
]


class TestEngineKeyEverywhere:
    """Every sim-engine route but three needs the key."""

    def test_every_route_but_three_needs_the_key(self, tmp_path: Path) -> None:
        """Without the key every served route is vLLM's 401 and changes nothing (the prefix
        cache survives a keyless /reset_prefix_cache); /health, /metrics and /version stay
        open, and a path the engine does not serve is still 404."""
        args = [*sim_args(), "--api-key", KEY, "--enable-sleep-mode"]
        with start_program(args, env=DEV, log_dir=tmp_path) as sim:
            filled = raw_request(sim.port, request("POST", "/v1/completions", COMPLETION, key=KEY))
            assert filled.status == 200, filled.body
            for method, path, body in GUARDED:
                for key in (None, "wrong"):
                    ans = raw_request(sim.port, request(method, path, body, key=key))
                    assert (ans.status, ans.json()) == (401, {"error": "Unauthorized"}), path
            for method, path, body in GUARDED:
                ans = raw_request(sim.port, request(method, path, body, key=KEY))
                assert ans.status != 401, (path, ans.body)
            for path in ("/health", "/metrics", "/version"):
                assert raw_request(sim.port, request("GET", path)).status == 200, path
            assert raw_request(sim.port, request("GET", "/nowhere")).status == 404
            no_traceback(sim.log_text())

    def test_keyless_reset_keeps_the_cache(self, tmp_path: Path) -> None:
        """A keyless POST /reset_prefix_cache leaves every cached block where it was."""
        with start_program([*sim_args(), "--api-key", KEY], log_dir=tmp_path) as sim:
            raw_request(sim.port, request("POST", "/v1/completions", COMPLETION, key=KEY))
            before = raw_request(sim.port, request("GET", "/sim/cache", key=KEY)).json()
            refused = raw_request(sim.port, request("POST", "/reset_prefix_cache"))
            after = raw_request(sim.port, request("GET", "/sim/cache", key=KEY)).json()
            assert (refused.status, after["blocks"]) == (401, before["blocks"])
            assert after["blocks"]


def big_bodies() -> dict[str, tuple[str, str]]:
    """About 7.9 MB each, every one past an 8,192-token context."""
    n = 7_900_000
    return {
        "one long message": (
            "/v1/chat/completions",
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "abcd" * (n // 4)}]}
            ),
        ),
        "many short messages": (
            "/v1/chat/completions",
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}] * (n // 32)}),
        ),
        "token ids": ("/v1/completions", json.dumps({"model": "m", "prompt": [1000] * (n // 6)})),
        "embedding inputs": (
            "/v1/embeddings",
            json.dumps({"model": "m", "input": ["ab"] * (n // 6)}),
        ),
    }


class TestBigBodiesBounded:
    """Big bodies are refused without holding memory."""

    @pytest.mark.parametrize("shape", list(big_bodies()))
    def test_ten_concurrent_refused_without_memory(self, shape: str, tmp_path: Path) -> None:
        """Three rounds of ten concurrent 7.9 MB bodies are each a 400 in vLLM's shape; the
        peak is about the bodies' own bytes (it was gigabytes: every prompt tokenized
        before its check) and the engine keeps nothing of them."""
        path, text = big_bodies()[shape]
        data = request("POST", path, text.encode())
        with start_program(sim_args(), log_dir=tmp_path) as sim:
            warm = raw_request(sim.port, request("POST", "/v1/completions", COMPLETION))
            assert warm.status == 200
            rss0 = status_kib(sim.pid, "VmRSS")
            answers: list[Answer] = []
            lock = threading.Lock()

            def send() -> None:
                ans = raw_request(sim.port, data, timeout_s=60)
                with lock:
                    answers.append(ans)

            for _ in range(3):
                threads = [threading.Thread(target=send) for _ in range(10)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            for ans in answers:
                err = assert_openai_error(ans, 400)
                assert "maximum context length" in err["message"] or "at most" in err["message"]
            assert len(answers) == 30
            peak_mib = (status_kib(sim.pid, "VmHWM") - rss0) // 1024
            left_mib = (status_kib(sim.pid, "VmRSS") - rss0) // 1024
            # Ten bodies are 79 MB of bytes held at once; one is decoded at a time.
            assert peak_mib < 400, peak_mib
            # What stays is the allocator's: freed objects of one decoded body in arenas
            # it keeps (1-65 MiB seen, by how the rounds interleaved). Anything kept per
            # request would be the 30 bodies' 237 MB of bytes, or more once decoded.
            assert left_mib < 120, left_mib
            ok = raw_request(sim.port, request("POST", "/v1/completions", COMPLETION))
            assert ok.status == 200
            no_traceback(sim.log_text())
