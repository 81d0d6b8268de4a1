"""One /metrics for a router of several workers: their pages merged into one.

Every worker renders the same families with the same label order, so a series
is identified by its exposition line up to the value, and merging needs no
label parsing. How a series merges depends on its family:

- counters, histograms, summaries: summed over the workers — and over the
  workers that died (`Merger.retire` keeps their last figures), so a restarted
  worker never makes a counter go backwards;
- per-endpoint gauges that describe the host, not a worker (in-flight counts are
  already host-wide, scrape age and staleness come from the one scraper, and each
  worker follows the same engines' KV events): the highest, never a sum; the
  breaker state too (the worst worker's breaker);
- `*_created` and `process_start_time_seconds`: the earliest;
- every other gauge (held requests, memory, descriptors): summed.
"""

from __future__ import annotations

from collections.abc import Iterable

# Gauges that every worker reports for the whole host: a sum would count them N times.
HOST_GAUGES = frozenset(
    {
        "llmgw_router_inflight",
        "llmgw_router_pending",
        "llmgw_router_scrape_age_seconds",
        "llmgw_router_endpoint_stale",
        "llmgw_router_breaker_state",
        # Every worker follows each engine's KV events itself (kvfollow.py): the
        # same engine's mode, link and block count, seen N times.
        "llmgw_router_prefix_mode",
        "llmgw_router_kv_events_connected",
        "llmgw_router_kv_events_blocks",
        "process_max_fds",
        # Each worker enforces the router's whole share of a key (one bucket for all).
        "llmgw_router_team_rpm_share",
        "llmgw_router_team_tpm_share",
    }
)
EARLIEST = frozenset({"process_start_time_seconds"})
# Family types whose figures only grow: kept from dead workers.
CUMULATIVE = frozenset({"counter", "histogram", "summary"})


class _Family:
    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_line: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_line
        self.samples: dict[str, float] = {}

    def rule(self) -> str:
        if self.kind in CUMULATIVE:
            return "sum"
        if self.name in HOST_GAUGES:
            return "max"
        if self.name in EARLIEST or self.name.endswith("_created"):
            return "min"
        return "sum"


Page = dict[str, _Family]


def parse(text: str) -> Page:
    """A page of Prometheus text (as prometheus_client renders it) by family."""
    page: Page = {}
    fam: _Family | None = None
    help_line = ""
    # Lines end at "\n" only: `splitlines` also splits at \x85, \x1c or U+2028, which a
    # label value (a key's team) may hold, and would cut its sample in two.
    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith("# HELP "):
            help_line = line
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            fam = page.get(name)
            if fam is None:
                fam = page[name] = _Family(name, kind, help_line)
            continue
        if line.startswith("#") or fam is None:
            continue
        key, _, value = line.rpartition(" ")
        try:
            fam.samples[key] = float(value)
        except ValueError:
            continue
    return page


def _combine(rule: str, a: float, b: float) -> float:
    if rule == "sum":
        return a + b
    if rule == "max":
        return max(a, b)
    return min(a, b)


def merge(pages: Iterable[Page]) -> Page:
    out: Page = {}
    for page in pages:
        for name, fam in page.items():
            into = out.get(name)
            if into is None:
                into = out[name] = _Family(name, fam.kind, fam.help)
            rule = into.rule()
            for key, value in fam.samples.items():
                have = into.samples.get(key)
                into.samples[key] = value if have is None else _combine(rule, have, value)
    return out


def render(page: Page) -> bytes:
    lines: list[str] = []
    for fam in page.values():
        if fam.help:
            lines.append(fam.help)
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        lines.extend(f"{key} {_number(v)}" for key, v in fam.samples.items())
    return ("\n".join(lines) + "\n").encode()


def _number(v: float) -> str:
    # prometheus_client's own spelling: repr of a float (1.0, 2.5e-05, +Inf never here).
    return repr(float(v))


class Merger:
    """The supervisor's view: each live worker's last page, and what dead ones left."""

    def __init__(self) -> None:
        self.pages: dict[int, Page] = {}
        # Cumulative figures of workers that died: kept so totals never go down.
        self.retired: Page = {}

    def update(self, index: int, text: bytes) -> None:
        self.pages[index] = parse(text.decode())

    def retire(self, index: int) -> None:
        """Worker `index` died: its counters stay in the totals, its gauges leave."""
        page = self.pages.pop(index, None)
        if page is None:
            return
        kept = {n: f for n, f in page.items() if f.kind in CUMULATIVE}
        self.retired = merge([self.retired, kept])

    def forget_endpoints(self, ids: Iterable[str]) -> None:
        """Removed endpoints lose their series in dead workers' figures too."""
        marks = tuple(f'endpoint="{i}"' for i in ids)
        if not marks:
            return
        for fam in self.retired.values():
            for key in [k for k in fam.samples if any(m in k for m in marks)]:
                del fam.samples[key]

    def render(self, extra: Iterable[Page] = ()) -> bytes:
        return render(merge([*self.pages.values(), self.retired, *extra]))
