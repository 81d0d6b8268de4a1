"""How the router talks to engines: the proxy's client, and the session off the path.

base.py             the seam: `Forwarder`, `ReplyHead`, header lines, error translation
fast.py             the proxy's client: targets, keep-alive pools, connecting, one retry
fastconn.py         its connection (asyncio protocol, llhttp) and the exchange it carries
aiohttp_client.py   the aiohttp session for the /metrics scrape and the controller link;
                    not a `Forwarder` since `upstream_client: aiohttp` was retired: the
                    proxy's client covers http and https engines, keep-alive, timeouts
                    and streams, and two relaying clients were one behaviour written twice
"""

from llmgw.router.upstream.base import KEEPALIVE_S, Forwarder, UpstreamReply

__all__ = ["KEEPALIVE_S", "Forwarder", "UpstreamReply"]
