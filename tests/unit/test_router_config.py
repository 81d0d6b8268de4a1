"""Router configuration: parsing, validation messages, reload comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.router.config import RESTART_ONLY, load, parse, restart_only_changes
from llmgw.router.errors import RouterConfigError

GOOD = """
endpoints:
  - {id: a, url: "http://127.0.0.1:9001/", models: [m1, m1-alias], weight: 2, priority: 1}
  - {id: b, url: "http://127.0.0.1:9002", models: [m1], engine: sglang, pool: ib0/H100}
models: [cold]
scrape_interval_s: 1
scrape_timeout_s: 0.5
api_keys: [{name: alice, sha256: "%s"}]
admin_token: s3cret
""" % ("ab" * 32)


class TestParse:
    """Parsing the router configuration file."""

    def test_full_file(self) -> None:
        """Every documented key parses into the typed config."""
        cfg = parse(GOOD)
        assert [e.id for e in cfg.endpoints] == ["a", "b"]
        assert cfg.endpoints[0].weight == 2.0
        assert cfg.endpoints[1].engine == "sglang"
        assert cfg.api_keys[0].name == "alice"
        assert cfg.admin_token == "s3cret"
        assert cfg.scrape_interval_s == 1.0

    def test_defaults(self) -> None:
        """An empty file is a valid router with documented defaults."""
        cfg = parse("")
        assert (cfg.scrape_interval_s, cfg.scrape_timeout_s, cfg.hold_timeout_s) == (2.0, 1.5, 120)
        assert (cfg.max_held, cfg.max_retries, cfg.max_body_bytes) == (1000, 2, 8 * 1024 * 1024)
        assert cfg.policy == "ours"
        assert cfg.endpoints == ()

    def test_known_models(self) -> None:
        """Known models are the configured ones plus every endpoint's names."""
        assert parse(GOOD).known_models() == {"m1", "m1-alias", "cold"}

    def test_trailing_slash_is_normalised(self) -> None:
        """Endpoint URLs lose their trailing slash."""
        assert parse(GOOD).endpoint_infos()[0].url == "http://127.0.0.1:9001"

    def test_controller_section(self) -> None:
        """A controller section parses with its token."""
        cfg = parse("controller: {url: 'http://c:9000', token: t}")
        assert cfg.controller is not None
        assert (cfg.controller.url, cfg.controller.token) == ("http://c:9000", "t")


# A file key up to its limits, for the cases that get them wrong.
KEY = "api_keys: [{name: a, sha256: " + "a" * 64 + ", "


class TestValidation:
    """Configuration errors name the field or the file."""

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("endpoints: [{id: a, url: 'http://x', models: [m], weight: heavy}]", "weight"),
            ("endpoints: [{id: a, models: [m]}]", "url"),
            ("endpoints: [{id: a, url: 'http://x', models: [m], colour: red}]", "colour"),
            ("surprise: 1", "surprise"),
            ("scrape_interval_s: 1\nscrape_timeout_s: 2", "scrape_timeout_s"),
            ("max_retries: -1", "max_retries"),
            ("policy: random", "policy"),
            ("api_keys: [{name: a, sha256: nothex}]", "sha256"),
            (KEY + "rpm: 0}]", "rpm"),
            (KEY + "budget: {tokens: 5}}]", "per"),
            (KEY + "priority: urgent}]", "priority"),
            (KEY + "models: [m, m]}]", "models"),
            ("endpoints: [{id: a, url: 'ftp://x', models: [m]}]", "url"),
            ("endpoints: [{id: a, url: 'http://x', models: []}]", "models"),
            # A misspelt engine would leave the endpoint unscraped (stale) for good.
            ("endpoints: [{id: a, url: 'http://x', models: [m], engine: vLLM}]", "engine"),
            (
                "endpoints: [{id: a, url: 'http://x', models: [m]}, "
                "{id: a, url: 'http://y', models: [m]}]",
                "repeated",
            ),
            (
                "controller: {url: 'http://c'}\nendpoints: [{id: a, url: 'http://x', models: [m]}]",
                "controller",
            ),
            (
                "endpoints: [{id: a, url: 'http://x', models: [m], kv_events: 'tcp://x:1'}]",
                "tokenizer",
            ),
            (
                "endpoints: [{id: a, url: 'http://x', models: [m], kv_events: 'x:1', "
                "tokenizer: sim}]",
                "kv_events",
            ),
            ("endpoints: [{id: a, url: 'http://x', models: [m], tokenizer: gpt}]", "tokenizer"),
            ("[1, 2]", "mapping"),
            # The controller's bound (wire.usage): past it every usage report is a 422.
            ("router_id: " + "r" * 257, "router_id"),
            ('router_id: "r\\x1b[2J"', "router_id"),
            ('router_id: ""', "router_id"),
            ("endpoints: [", "YAML"),
            ("max_body_bytes: 2048\nmax_upload_bytes: 1024", "max_upload_bytes"),
            ("max_inflight_body_bytes: 9000000\nmax_upload_bytes: 9000001", "max_upload_bytes"),
            ("max_upload_bytes: 0", "max_upload_bytes"),
        ],
    )
    def test_bad_file_names_the_field(self, text: str, needle: str) -> None:
        """Each invalid file raises RouterConfigError with a one-line message naming the field."""
        with pytest.raises(RouterConfigError, match=needle) as info:
            parse(text)
        assert "\n" not in str(info.value)

    def test_controller_credentials_beside_a_token_are_refused_unechoed(self) -> None:
        """A user or password in controller.url beside controller.token is refused without
        repeating it: aiohttp refused every call (ValueError) and the loop that follows the
        controller died, leaving the router with no endpoints."""
        text = "controller: {url: 'http://u:pw-canary@c:8081', token: t}"
        with pytest.raises(RouterConfigError, match=r"controller\.url") as info:
            parse(text)
        assert "pw-canary" not in str(info.value)
        # Alone, they are what the router sends (basic auth to a proxy in front).
        assert parse("controller: {url: 'http://u:pw@c:8081'}").controller is not None

    @pytest.mark.parametrize("value", ["0.05", "0.0999", "300.5", "3000000"])
    def test_connect_timeout_out_of_bounds(self, value: str) -> None:
        """A connect timeout under 0.1 s or over 300 s is refused, its bounds said: past
        2^31 ms (about 25 days) the TCP user timeout could not be set, and every
        connection to an engine failed."""
        with pytest.raises(RouterConfigError, match=r"connect_timeout_s .* between 0\.1 and 300"):
            parse(f"connect_timeout_s: {value}")

    def test_connect_timeout_bounds_are_allowed(self) -> None:
        """0.1 s and 300 s, the bounds themselves, are taken."""
        assert parse("connect_timeout_s: 0.1").connect_timeout_s == 0.1
        assert parse("connect_timeout_s: 300").connect_timeout_s == 300.0

    def test_router_id_up_to_the_controllers_bound(self) -> None:
        """A printable router_id of 256 characters, what the controller takes, is kept."""
        assert parse("router_id: " + "é" * 256).router_id == "é" * 256

    @pytest.mark.parametrize(
        ("text", "limit"),
        [
            ("{}", 26 * 1024 * 1024),
            ("max_body_bytes: 67108864", 64 * 1024 * 1024),
            ("max_body_bytes: 1024\nmax_inflight_body_bytes: 4096", 2048),
            ("max_inflight_body_bytes: 8388608\nclient_share: 1.0", 8 * 1024 * 1024),
            ("max_upload_bytes: 16777216", 16 * 1024 * 1024),
        ],
    )
    def test_upload_limit(self, text: str, limit: int) -> None:
        """Uploads take 26 MiB unless set (an audio file OpenAI takes), or max_body_bytes
        if larger, within one address's share of the in-flight budget a file sets; a set
        one as it is."""
        assert parse(text).upload_limit() == limit

    def test_missing_file(self, tmp_path: Path) -> None:
        """A file that cannot be read is a RouterConfigError naming the path."""
        with pytest.raises(RouterConfigError, match="cannot read"):
            load(tmp_path / "nope.yaml")


class TestReload:
    """A reload reports the fields that need a restart."""

    def test_restart_only_fields_are_reported(self) -> None:
        """Changing a start-time setting is named; changing endpoints is not."""
        old = parse(GOOD)
        new = parse(GOOD.replace("scrape_interval_s: 1", "scrape_interval_s: 1\nrouter_id: r2"))
        assert restart_only_changes(old, new) == ["router_id"]
        assert restart_only_changes(old, parse(GOOD.replace("cold", "colder"))) == []

    def test_flow_is_restart_only(self) -> None:
        """Flow control's queues are built at start: a reload changing `flow` is named."""
        old = parse(GOOD)
        assert restart_only_changes(old, parse(GOOD + "flow: {enabled: false}\n")) == ["flow"]

    def test_the_docs_mark_the_same_fields_restart_only(self) -> None:
        """docs/router.md's top-level table marks restart-only (or read once at start)
        exactly the fields a reload names as needing a restart."""
        doc = (Path(__file__).parents[2] / "docs" / "router.md").read_text()
        table = doc.split("<!-- fields: llmgw.router.config.RouterConfig -->")[1]
        marked = set()
        for line in table.split("\n\n")[0].splitlines():
            if "restart-only" in line or "read once at start" in line:
                marked.add(line.split("`")[1])
        assert marked == set(RESTART_ONLY)
