"""The status page in a real headless chromium, as an operator of a large fleet uses it.

A real controller loads a fleet of 500 nodes × 8 GPUs, 2,000 models (300 of them
unplaceable) and 3,000 ready replicas written into its SQLite store
(tests/integration/bigfleet.py); the page polls it as it would in production. Then the
controller hangs (SIGSTOP), answers what the page cannot read (a relay in front of it,
tests/integration/browser.py), and is restarted with another token.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.procs import free_port
from llmgw.testing.wait import wait_until
from tests.integration.bigfleet import seed_fleet
from tests.integration.browser import Garbler, chromium
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


class TestRefreshInPlace:
    """A refresh changes the rows that changed, so what the operator selected stays selected."""

    def test_a_selected_name_survives_refreshes(self, big: Controller, browser: Any) -> None:
        """A selected model name stays selected, in the same row element, across refreshes."""
        open_page(browser, big.url)
        js(
            browser,
            """const tr = document.querySelector('[data-table=models] tr[data-key="model-0005"]');
            tr.dataset.mark = 'kept';
            const r = document.createRange(); r.selectNodeContents(tr.cells[0]);
            getSelection().removeAllRanges(); getSelection().addRange(r);""",
        )
        dom = js(browser, "return document.getElementsByTagName('*').length")
        wait_refreshes(browser, 2)
        assert js(browser, "return getSelection().toString()") == "model-0005"
        assert js(browser, "return document.querySelector('[data-mark=kept]')?.dataset.key") == (
            "model-0005"
        )
        assert js(browser, "return document.getElementsByTagName('*').length") == dom


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


class TestLongLists:
    """The summary's lists stay short on a big fleet; the tables below hold the rest."""

    def test_three_hundred_unplaceable_models(self, big: Controller, browser: Any) -> None:
        """300 unplaceable models show as a few names and a line saying how many more."""
        open_page(browser, big.url)
        wait_until(
            lambda: js(browser, "return document.querySelector('[data-k=\"models.short\"]')"
                       ".textContent") == str(UNPLACEABLE),
            timeout_s=30,
            what="placement to find the unplaceable models",
        )  # fmt: skip
        wait_refreshes(browser, 1)
        named = js(browser, "return document.querySelectorAll('#unplaceable li[data-name]').length")
        assert 0 < named <= 20
        more = js(browser, "return document.querySelector('#unplaceable li.more').textContent")
        assert f"{UNPLACEABLE - named} more" in more


class TestUnreadableAnswer:
    """An answer the page cannot read is named as such and the last good picture stays usable."""

    def test_html_and_wrong_json_then_recovery(self, big: Controller, browser: Any) -> None:
        """A proxy's HTML page, then JSON of another shape: the page says it cannot read them,
        its filter still works on the last picture, and it goes live again by itself."""
        relay = Garbler(big.url)
        try:
            open_page(browser, relay.url)
            wait_conn(browser, "live")
            relay.garble = ("application/json", b'{"error": "maintenance"}')
            wait_conn(browser, "unreadable")
            box = 'document.querySelector("[data-table=nodes] input")'
            js(browser, f"{box}.value = 'node-0001'; {box}.dispatchEvent(new Event('input'))")
            assert count(browser, "nodes") == f"1 of {NODES}"
            relay.garble = ("text/html", b"<html><body>502 Bad Gateway</body></html>")
            wait_until(lambda: "<" not in conn(browser), timeout_s=10, what="a new badge")
            assert "unreadable" in wait_conn(browser, "unreadable")
            relay.garble = None
            wait_conn(browser, "live")
            js(browser, f"{box}.value = ''; {box}.dispatchEvent(new Event('input'))")
            assert count(browser, "nodes").startswith(f"{NODES} of {NODES}")
        finally:
            relay.close()


class TestHungController:
    """A controller that takes connections but never answers is reported within seconds."""

    def test_sigstop_then_sigcont(self, tmp_path: Path, browser: Any) -> None:
        """While the controller is stopped the page says it is not answering; it goes live
        again by itself once the controller runs on."""
        with controller(Db(f"sqlite:///{tmp_path}/c.db"), token=TOKEN, log_dir=tmp_path) as c:
            open_page(browser, c.url)
            wait_conn(browser, "live")
            os.kill(c.program.pid, signal.SIGSTOP)
            try:
                wait_conn(browser, "not reachable", timeout_s=20)
            finally:
                os.kill(c.program.pid, signal.SIGCONT)
            wait_conn(browser, "live", timeout_s=20)


class TestTokenRefused:
    """A token the controller stops taking brings back the login form, and a new one the fleet."""

    def test_controller_restarted_with_another_token(self, tmp_path: Path, browser: Any) -> None:
        """After a restart with a new token the page asks for it, then shows the fleet again
        without a reload."""
        from selenium.webdriver.common.by import By

        db, port = Db(f"sqlite:///{tmp_path}/c.db"), str(free_port())
        with controller(db, "--port", port, token="old-token", log_dir=tmp_path) as c:
            open_page(browser, c.url, token="old-token")
            url = c.url
        with controller(db, "--port", port, token="new-token", log_dir=tmp_path):
            wait_until(
                lambda: browser.find_element(By.ID, "login").is_displayed(),
                timeout_s=20,
                what="the login form",
            )
            assert browser.find_element(By.ID, "login-error").text == "the token was refused"
            browser.find_element(By.ID, "token").send_keys("new-token")
            browser.find_element(By.CSS_SELECTOR, "#login button").click()
            wait_until(
                lambda: browser.find_element(By.ID, "fleet").is_displayed(),
                timeout_s=20,
                what="the fleet again",
            )
            wait_conn(browser, "live")
            assert browser.current_url.startswith(url)
