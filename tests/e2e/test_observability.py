"""See the fleet, end to end on `llmgw up`: every program's /metrics (promtool), the
dashboard's queries against a live scrape, and the status page in a real headless
chromium, compared with `llmgw ctl status --json` and watched change after a cordon.

Screenshots of the page are kept in `test-artifacts/` at the repository root (or
$LLMGW_TEST_ARTIFACTS), overwritten by each run, ignored by git (docs/testing.md).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing.wait import wait_until
from tests.e2e.conftest import HERE, System, kill_leftovers, start_up, wait_for
from tests.integration.test_deploy_prometheus import dashboard_metric_names, rule_metric_names
from tests.promtool import check_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    tmp = tmp_path_factory.mktemp("e2e-observe")
    system = start_up(tmp, HERE / "fleet.yaml")
    try:
        wait_for(lambda: system.ready("chat"), timeout_s=120, what="a ready chat replica")
        yield system
    finally:
        try:
            system.stop(grace_s=60)
        finally:
            kill_leftovers(tmp)


def scrape(url: str, token: str | None = None) -> bytes:
    req = urllib.request.Request(url + "/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        body: bytes = resp.read()
    return body


def declared(body: bytes) -> set[str]:
    """Every series name the exposition declares (# TYPE), histograms with their parts."""
    out: set[str] = set()
    for m in re.finditer(rb"^# TYPE (\S+) (\S+)$", body, re.M):
        name, kind = m.group(1).decode(), m.group(2).decode()
        out.add(name)
        if kind == "histogram":
            out.update({name + "_bucket", name + "_sum", name + "_count"})
    return out


# -- the status page ----------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium and chromium-driver are not installed (scripts/test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,2400"):
        opts.add_argument(arg)
    opts.add_argument("--disable-dev-shm-usage")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    root = Path(__file__).resolve().parents[2]
    folder = Path(os.environ.get("LLMGW_TEST_ARTIFACTS") or root / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def page_numbers(driver: Any) -> dict[str, Any]:
    """What the page shows: the summary's numbers, GPU rows and fabric rows."""
    js = """
    const out = {k: {}, gpus: {}, fabrics: {}};
    for (const e of document.querySelectorAll('[data-k]')) out.k[e.dataset.k] = e.textContent;
    for (const tr of document.querySelectorAll('#gpus tbody tr')) {
      const c = (s) => tr.querySelector('td.' + s).textContent;
      out.gpus[tr.dataset.gpuClass] = [c('used'), c('free'), c('unhealthy'), c('total')];
    }
    for (const tr of document.querySelectorAll('#fabrics tbody tr')) {
      out.fabrics[tr.dataset.fabric] = [tr.querySelector('.nodes').textContent,
                                        tr.querySelector('.free-nodes').textContent];
    }
    out.unplaceable = [...document.querySelectorAll('#unplaceable li[data-name]')]
      .map((li) => li.dataset.name);
    return out;
    """
    result: dict[str, Any] = driver.execute_script(js)
    return result


def ctl_numbers(summary: dict[str, Any]) -> dict[str, Any]:
    """The same figures from `ctl status --json`, as the page would print them."""
    k = {
        f"{group}.{field}": str(value)
        for group in ("nodes", "replicas", "models")
        for field, value in summary[group].items()
    }
    gpus = {
        c["class"]: [
            str(c["used"]),
            str(c["total"] - c["used"] - c["unhealthy"]),
            str(c["unhealthy"]),
            str(c["total"]),
        ]
        for c in summary["gpus"]
    }
    fabrics = {
        f["fabric"]: [str(f["nodes"]), str(f["largest_free_block"])] for f in summary["fabrics"]
    }
    return {"k": k, "gpus": gpus, "fabrics": fabrics, "unplaceable": summary["unplaceable"]}


def agree(system: System, driver: Any, *, timeout_s: float = 20) -> dict[str, Any]:
    """Until the page and `ctl status --json` show the same fleet (the page polls)."""

    def same() -> dict[str, Any]:
        want = ctl_numbers(system.ctl("status", "--json"))
        got = page_numbers(driver)
        assert got == want, f"page={got} ctl={want}"  # shown if they never agree
        return want

    return wait_until(
        same, timeout_s=timeout_s, every_s=0.5, ignore=(AssertionError,), what="page and ctl agree"
    )


class TestSeeTheFleet:
    """Every program's metrics, the dashboard and the status page on llmgw up."""

    def test_up_prints_the_status_page_address(self, system: System) -> None:
        """llmgw up prints the status page address."""
        log = system.prog.log_text()
        # The read token (it can change nothing) rides in the fragment, never sent in the URL.
        url = f"{system.controller_url}/status#token={system.token('read')}"
        assert f"status page          {url}" in log
        assert system.manifest()["status_url"] == url
        assert system.token("admin") not in log

    def test_every_program_passes_promtool_and_the_dashboard_finds_its_metrics(
        self,
        system: System,
    ) -> None:
        """Every program passes promtool; the dashboard and the alert rules find their metrics."""
        client = system.client()
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        stream = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert list(stream)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )

        manifest = system.manifest()
        bodies = {
            "router": scrape(system.router_url),
            "controller": scrape(system.controller_url, system.token("read")),
        }
        agents = {n: c["url"] for n, c in manifest["children"].items() if n.startswith("agent ")}
        assert agents
        for name, url in agents.items():
            bodies[name] = scrape(url)
        # The sim-engine is left out: it speaks vLLM's metric names ("vllm:…"), whose colon
        # promtool's lint rejects in real vLLM just the same.
        for name, body in bodies.items():
            try:
                check_metrics(body)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from None

        seen: set[str] = set()
        for body in bodies.values():
            seen |= declared(body)
        missing = sorted(dashboard_metric_names() - seen)
        assert missing == [], f"the dashboard queries metrics no program exports: {missing}"
        missing = sorted(rule_metric_names() - seen)
        assert missing == [], f"the alert rules query metrics no program exports: {missing}"

        router = bodies["router"].decode()
        assert re.search(r'llmgw_router_completion_tokens_total\{model="chat"\} (\d+)', router)
        assert 'code="404",endpoint="",model="",outcome="rejected"' in router
        controller = bodies["controller"].decode()
        assert "llmgw_controller_leader 1.0" in controller
        summary = system.ctl("status", "--json")
        total = sum(c["total"] for c in summary["gpus"])
        gpus = sum(
            float(v)
            for v in re.findall(r"^llmgw_controller_gpus\{[^}]*\} (\S+)$", controller, re.M)
        )
        assert gpus == total
        agent_body = next(iter(bodies[n] for n in agents)).decode()
        assert 'llmgw_agent_info{inventory="fake"' in agent_body

    def test_status_page_shows_what_ctl_status_shows_and_follows_a_cordon(
        self, system: System, browser: Any, artifacts: Path
    ) -> None:
        """The status page shows what ctl status shows and follows a cordon."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        t0 = time.monotonic()
        browser.get(system.manifest()["status_url"])
        WebDriverWait(browser, 10).until(ec.visibility_of_element_located((By.ID, "fleet")))
        first_render_s = time.monotonic() - t0
        print(f"status page first render: {first_render_s * 1000:.0f} ms")
        assert browser.find_element(By.ID, "leader").text == "leader"
        assert browser.title == "llmgw fleet"
        before = agree(system, browser)
        assert int(before["k"]["nodes.total"]) == 4
        rows = browser.find_elements(By.CSS_SELECTOR, 'section[data-table="nodes"] tbody tr')
        assert [r.get_attribute("data-key") for r in rows] == ["a-1", "a-2", "a-3", "b-1"]
        browser.save_screenshot(str(artifacts / "status-before-cordon.png"))

        system.ctl("cordon", "a-1")
        try:
            after = agree(system, browser)
            assert after["k"]["nodes.cordoned"] == "1"
            assert int(after["k"]["nodes.ready"]) == int(before["k"]["nodes.ready"]) - 1
            cell = browser.find_element(
                By.CSS_SELECTOR, 'section[data-table="nodes"] tr[data-key="a-1"] td:nth-child(2)'
            )
            assert cell.text == "cordoned"
            browser.save_screenshot(str(artifacts / "status-after-cordon.png"))
        finally:
            system.ctl("uncordon", "a-1")
        events = browser.find_element(By.CSS_SELECTOR, 'section[data-table="events"] tbody').text
        assert "node.cordoned" in events or "cordon" in events
        for shot in ("status-before-cordon.png", "status-after-cordon.png"):
            assert (artifacts / shot).stat().st_size > 10_000

    def test_status_page_filter_narrows_a_table(self, system: System, browser: Any) -> None:
        """The status page filter narrows a table."""
        from selenium.webdriver.common.by import By

        browser.get(system.manifest()["status_url"])
        agree(system, browser)
        box = browser.find_element(By.CSS_SELECTOR, 'section[data-table="nodes"] input')
        box.send_keys("b-")
        rows = browser.find_elements(By.CSS_SELECTOR, 'section[data-table="nodes"] tbody tr')
        assert [r.get_attribute("data-key") for r in rows] == ["b-1"]
        count = browser.find_element(By.CSS_SELECTOR, 'section[data-table="nodes"] .count').text
        assert count == "1 of 4"

    def test_a_malformed_token_in_the_address_shows_the_login_form(
        self, system: System, browser: Any
    ) -> None:
        """A malformed token in the address shows the login form, not a blank page."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        browser.get(f"{system.controller_url}/status#token=%zz")
        WebDriverWait(browser, 10).until(ec.visibility_of_element_located((By.ID, "login")))
        assert browser.find_element(By.ID, "login-error").text == "the token was refused"
        assert "token" not in browser.current_url
