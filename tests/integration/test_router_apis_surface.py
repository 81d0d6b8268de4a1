"""The passed-through APIs' edges through a real router in front of real sim-engines.

The paths vLLM serves beside the usual ones (`/v2/rerank`), the stored-response
routes the router never routes, the upload limit apart from the JSON one, and
the 405s' `Allow`; with the openai package where it has a method for the route.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest

from llmgw.testing import Program

from .hostile import assert_openai_error, raw_request
from .router_fixtures import MODEL, base_config, endpoint_entries, router, sim_engines

pytestmark = pytest.mark.timeout(120)

KIB = 1024
JSON_LIMIT = 64 * KIB
UPLOAD_LIMIT = 1024 * KIB


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    """Two fast sim-engines behind one router whose uploads may be larger than its JSON."""
    log_dir = tmp_path_factory.mktemp("router-apis-surface")
    with sim_engines(log_dir, [100.0, 100.0]) as engines:
        cfg = base_config(
            endpoints=endpoint_entries(engines),
            max_body_bytes=JSON_LIMIT,
            max_upload_bytes=UPLOAD_LIMIT,
        )
        with router(log_dir, cfg) as r:
            yield r


@pytest.fixture
def url(fleet: Program) -> str:
    return fleet.url


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def upload(size: int) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("file", b"RIFF" + bytes(size), filename="a.wav")
    form.add_field("model", MODEL)  # after the file: found past it
    return form


def upload_bytes(size: int) -> tuple[bytes, str]:
    """A transcription form of a `size`-byte file (the model after it), and its type."""
    file = b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    model = b'Content-Disposition: form-data; name="model"\r\n\r\n' + MODEL.encode()
    body = b"--b\r\n" + file + b"RIFF" + bytes(size) + b"\r\n--b\r\n" + model + b"\r\n--b--\r\n"
    return body, "multipart/form-data; boundary=b"


async def in_chunks(raw: bytes, size: int) -> AsyncIterator[bytes]:
    """`raw` as a chunked request body of `size`-byte chunks."""
    for at in range(0, len(raw), size):
        yield raw[at : at + size]


class TestRerankPaths:
    """Every path vLLM serves rerank on is routed."""

    async def test_v2_rerank(self, url: str, session: aiohttp.ClientSession) -> None:
        """/v2/rerank (vLLM's Cohere-compatible path) is routed and answered, not a 404."""
        body = {"model": MODEL, "query": "q", "documents": ["a", "b"], "top_n": 1}
        async with session.post(url + "/v2/rerank", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers.get("x-llmgw-endpoint") in ("e0", "e1")
            assert len((await resp.json())["results"]) == 1


class TestStoredResponses:
    """A stored response's routes are a 404 saying why, never routed."""

    def test_sdk_calls_get_404_response_not_found(self, url: str) -> None:
        """responses.retrieve, delete, cancel and input_items.list raise NotFoundError with
        code response_not_found and a message that names the id, not "Invalid URL"."""
        with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
            calls = [
                lambda: client.responses.retrieve("resp_abc"),
                lambda: client.responses.delete("resp_abc"),
                lambda: client.responses.cancel("resp_abc"),
                lambda: list(client.responses.input_items.list("resp_abc")),
            ]
            for call in calls:
                with pytest.raises(openai.NotFoundError) as info:
                    call()
                assert info.value.code == "response_not_found"
                assert "'resp_abc' not found" in info.value.message
                assert "stored responses" in info.value.message

    @pytest.mark.parametrize(
        ("target", "quoted"),
        [
            ("/v1/responses/../../admin/config", ".."),
            ("/v1/responses/..%2F..%2Fadmin%2Fconfig", ".."),
            ("/v1/responses/r%C3%A9sp%00x", "résp\x00x"),
            ("/v1/responses/" + "a" * 4000 + "/cancel", "a" * 256 + "…"),
        ],
    )
    def test_hostile_ids(self, url: str, target: str, quoted: str) -> None:
        """Ids with `../`, encoded slashes, non-ASCII or NUL, or 4000 characters: the same
        404 (the id quoted, cut at 256 characters), no engine asked."""
        port = urlsplit(url).port
        assert port is not None
        head = f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ans = raw_request(port, head.encode())
        err = assert_openai_error(ans, 404)
        assert err["code"] == "response_not_found"
        assert f"Response with id {quoted!r} not found" in err["message"]
        assert "x-llmgw-endpoint" not in ans.headers


class TestUploadLimit:
    """Uploads have their own limit, apart from the JSON bodies'."""

    async def test_upload_over_the_json_limit_is_taken(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """An upload of 8 times max_body_bytes, within max_upload_bytes, is routed and
        answered, declared or chunked."""
        async with session.post(url + "/v1/audio/transcriptions", data=upload(8 * JSON_LIMIT)) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["text"]
        raw, ctype = upload_bytes(8 * JSON_LIMIT)
        async with session.post(
            url + "/v1/audio/translations",
            data=in_chunks(raw, 64 * KIB),
            headers={"Content-Type": ctype},
        ) as r:
            assert r.status == 200, await r.text()

    async def test_upload_over_its_limit_is_413(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """An upload over max_upload_bytes is a 413 naming that limit, no engine asked."""
        raw, ctype = upload_bytes(UPLOAD_LIMIT + KIB)
        async with session.post(
            url + "/v1/audio/transcriptions", data=io.BytesIO(raw), headers={"Content-Type": ctype}
        ) as resp:
            assert resp.status == 413
            assert str(UPLOAD_LIMIT) in (await resp.json())["error"]["message"]
            assert "x-llmgw-endpoint" not in resp.headers

    @pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize", "/v1/responses"])
    async def test_json_keeps_its_limit(
        self, url: str, session: aiohttp.ClientSession, path: str
    ) -> None:
        """A JSON body over max_body_bytes is still a 413 naming that limit, declared or
        chunked, on the proxy's routes and the passed-through ones."""
        doc = {"model": MODEL, "prompt": "x" * (2 * JSON_LIMIT)}
        raw = json.dumps(doc).encode()
        for data in (raw, in_chunks(raw, 16 * KIB)):
            async with session.post(
                url + path, data=data, headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == 413
                assert str(JSON_LIMIT) in (await resp.json())["error"]["message"]


class TestUploadForms:
    """A form whose `model` the engine would read otherwise is refused before routing."""

    async def test_model_sent_as_a_file_is_refused(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """A `model` part with a filename (the engine reads a file, and serves its default
        model) is the router's 400, the engine never asked."""
        form = aiohttp.FormData()
        form.add_field("model", MODEL, filename="m.txt")
        form.add_field("file", b"RIFF" + bytes(100), filename="a.wav")
        async with session.post(url + "/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 400
            assert "is a file" in (await resp.json())["error"]["message"]
            assert "x-llmgw-endpoint" not in resp.headers


class TestAllow:
    """A 405 names every method the route takes."""

    async def test_model_routes_allow_get_and_head(
        self, url: str, session: aiohttp.ClientSession
    ) -> None:
        """DELETE /v1/models/m and POST /v1/models: 405 with `Allow: GET, HEAD` (HEAD is
        answered there), and HEAD itself a 200."""
        for method, path in (("DELETE", "/v1/models/" + MODEL), ("POST", "/v1/models")):
            async with session.request(method, url + path) as resp:
                assert (resp.status, resp.headers.get("Allow")) == (405, "GET, HEAD")
        async with session.head(url + "/v1/models") as resp:
            assert resp.status == 200
