"""A standby's way to the leader: where it is, and the usage reports relayed there.

Routers take one controller URL (a name for every controller, or a load balancer),
so some send their reports to a standby. Answered there, the leader would never
see them: its leases would split a key's limit among its own routers only (each
controller handing out the whole limit), and a replica used only through the
standby would look idle to it. So a standby relays each report to the leader and
answers the router with the leader's answer (api/usage.py).

The leader records the URL it is reachable at (--advertise-url, else its
--host and port) in the store when it takes the lock (`advertise`); a standby
reads it with each reload (`reload`). A report is relayed with the router's own
Authorization and a header saying so; a controller never relays a relayed report
(a stale URL may name a controller that no longer leads, or this one), and a
standby answers one with 503, so a report is never passed around in a circle.

A leader that does not answer within `timeout_s` (below the router's own 5 s, so
the fallback still answers in time), or answers anything but 2xx, leaves the
report to this controller: it keeps the token rows itself (idempotent, store/usage.py)
so none is lost, but answers 503 rather than lease: its own book has seen only its
own routers and would lease beyond the limit, and a 2xx without shares would tell
the router the controller leases nothing (it would enforce whole limits). On a 503
the router keeps the shares it holds, as one cut off does (docs/tenants.md), and
sends the rows again later, which changes nothing. Failures are logged when they
start and when they end, not per report, and counted by outcome on /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

import aiohttp
from prometheus_client import Counter

from llmgw.controller.store import Store, StoreError
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.runtime.repeats import FailureLog

log = logging.getLogger(__name__)

# Marks a relayed report; its value is the relaying controller's URL (or "standby").
RELAYED_HEADER = "X-Llmgw-Relayed-By"
# Seconds a relay may take: under the router's 5 s report timeout, with room to
# handle the report here when the leader does not answer.
RELAY_TIMEOUT_S = 2.0

Outcome = Literal["relayed", "failed", "no_leader_url"]


@dataclass(frozen=True, slots=True)
class Relayed:
    """The leader's answer to a relayed report, passed on to the router as it came."""

    status: int
    body: bytes
    content_type: str | None


class LeaderLink:
    """Where the leader is (from the store) and the relay of reports to it."""

    def __init__(
        self,
        store: Store,
        *,
        own_url: str | None,
        timeout_s: float = RELAY_TIMEOUT_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self._clock = clock
        # A store that refuses the read refuses it at every reload (runtime/repeats.py).
        self._reads = FailureLog(
            "leader url read failed",
            cleared="leader url read again",
            count_as="reads_failed",
            logger=log,
        )
        # What this controller records when it leads; None: it knows no URL of its own.
        self.own_url = own_url
        self.timeout_s = timeout_s
        # The leader's URL as the store said at the last reload; None: none recorded
        # (or not read yet), and reports are answered here.
        self.leader_url: str | None = None
        self._session: aiohttp.ClientSession | None = None
        # Whether the last relay failed / the last report found no URL (logs say
        # when each starts and ends, not once per report).
        self._failing = False
        self._no_url_said = False
        self.relays = Counter(
            "llmgw_controller_usage_relays",
            "Usage reports a standby received, by outcome: relayed (the leader answered), "
            "failed (handled here), no_leader_url (the leader recorded none: handled here).",
            ["outcome"],
            registry=None,
        )

    def collectors(self) -> tuple[Counter, ...]:
        return (self.relays,)

    # -- where the leader is -------------------------------------------------

    async def advertise(self) -> None:
        """Record `own_url` as the leader's (once a term; None clears a predecessor's).
        Raises StoreError (NotLeader among them) when the store refuses."""
        await asyncio.to_thread(self.store.set_leader_url, self.own_url)
        self.leader_url = None
        if self.own_url is None:
            log.warning(
                "leading with no URL to advertise: --host listens on every interface and "
                "no --advertise-url was given, so standbys answer usage reports alone"
            )
        else:
            log.info(kv("advertised", url=self.own_url))

    async def reload(self) -> None:
        """Read the leader's URL (a standby, with each reload); a failed read keeps the
        last one known."""
        try:
            url = await asyncio.to_thread(self.store.leader_url)
        except StoreError as exc:
            self._reads.failed(str(exc), now=self._clock.monotonic())
            return
        self._reads.worked()
        # Our own URL: recorded while this controller led, before it lost the lock.
        self.leader_url = None if url == self.own_url else url

    # -- the relay ------------------------------------------------------------

    async def relay(self, body: bytes, authorization: str | None) -> Relayed | Outcome:
        """POST a report to the leader: its 2xx answer, or why it is to be handled here."""
        url = self.leader_url
        if url is None:
            self._count("no_leader_url")
            if not self._no_url_said:
                self._no_url_said = True
                log.warning(
                    "usage reports answered here: the leader recorded no URL to reach it "
                    "at (give it --advertise-url); its leases do not count this standby's "
                    "routers"
                )
            return "no_leader_url"
        self._no_url_said = False
        headers = {"Content-Type": "application/json", RELAYED_HEADER: self.own_url or "standby"}
        if authorization is not None:
            headers["Authorization"] = authorization
        try:
            session = self._client()
            async with session.post(f"{url}/v1/usage", data=body, headers=headers) as resp:
                answer = Relayed(resp.status, await resp.read(), resp.headers.get("Content-Type"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._failed(url, repr(exc))
        if not 200 <= answer.status < 300:
            return self._failed(url, f"answered {answer.status}")
        self._count("relayed")
        if self._failing:
            self._failing = False
            log.info(kv("usage reports reach the leader again", leader=url))
        return answer

    def _failed(self, url: str, why: str) -> Outcome:
        self._count("failed")
        if not self._failing:
            self._failing = True
            log.warning(
                kv(
                    "usage report relay failed; rows kept here, answered 503",
                    leader=url,
                    error=why,
                )
            )
        return "failed"

    def _count(self, outcome: Outcome) -> None:
        self.relays.labels(outcome).inc()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        return self._session

    async def close(self) -> None:
        """Close the relay's connections (the app's cleanup)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
