"""The status page in a real headless chromium, as an operator of a large fleet uses it.

A real controller loads a fleet of 500 nodes × 8 GPUs, 2,000 models (300 of them
unplaceable) and 3,000 ready replicas written into its SQLite store
(tests/integration/bigfleet.py); the page polls it as it would in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmgw.testing.wait import wait_until
from tests.integration.bigfleet import seed_fleet
from tests.integration.browser import chromium
from tests.integration.controller_harness import Controller, Db, controller

pytestmark = pytest.mark.timeout(180)

TOKEN = "status-page-token"
NODES, MODELS, UNPLACEABLE, REPLICAS = 500, 2000, 300, 3000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    tmp = tmp_path_factory.mktemp("status-big")
    db = f"sqlite:///{tmp}/c.db"
    seed_fleet(
        db, nodes=NODES, gpus_per_node=8, models=MODELS, replicas=REPLICAS, unplaceable=UNPLACEABLE
    )
    # No agents: nodes stay ready on the heartbeat they were written with.
    with controller(Db(db), "--heartbeat-timeout-s", "3600", token=TOKEN, log_dir=tmp) as c:
        yield c


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def open_page(driver: Any, url: str, token: str = TOKEN) -> None:
    driver.get("about:blank")
    driver.get(f"{url}/status#token={token}")
    wait_until(
        lambda: js(driver, "return document.body.dataset.firstRenderMs"),
        timeout_s=30,
        what="the page's first complete picture",
    )


def conn(driver: Any) -> str:
    text: str = js(driver, "return document.getElementById('conn').textContent")
    return text


def wait_conn(driver: Any, word: str, *, timeout_s: float = 20) -> str:
    return wait_until(
        lambda: word in conn(driver) and conn(driver),
        timeout_s=timeout_s,
        every_s=0.2,
        what=f"the connection badge to say {word!r} (it says {conn(driver)!r})",
    )


def wait_refreshes(driver: Any, n: int) -> None:
    """Until the page has drawn `n` new answers (the clock shows each answer's time)."""
    for _ in range(n):
        before = js(driver, "return document.getElementById('clock').textContent")
        wait_until(
            lambda b=before: js(driver, "return document.getElementById('clock').textContent") != b,
            timeout_s=15,
            what="a refresh",
        )


def count(driver: Any, table: str) -> str:
    q = f"[data-table={table}] .count"
    text: str = js(driver, f"return document.querySelector('{q}').textContent")
    return text


class TestCompressedData:
    """What the page fetches each refresh crosses the wire compressed."""

    def test_a_refresh_of_a_big_fleet_is_compressed(self, big: Controller, browser: Any) -> None:
        """At 500 nodes and 3,000 replicas a refresh transfers under a quarter of its JSON."""
        open_page(browser, big.url)
        wait_refreshes(browser, 1)
        sizes = js(
            browser,
            """return performance.getEntriesByType('resource')
              .filter((e) => e.name.endsWith('/admin/status'))
              .map((e) => [e.encodedBodySize, e.decodedBodySize]);""",
        )
        assert sizes, "no fetch of /admin/status recorded"
        encoded, decoded = sizes[-1]
        assert decoded > 100_000, sizes
        assert encoded * 4 < decoded, sizes
