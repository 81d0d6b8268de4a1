"""How the router talks to engines: the seam, and two clients behind it.

base.py             the seam: `Forwarder`, `ReplyHead`, header lines, error translation
fast.py             the default client: targets, keep-alive pools, connecting, one retry
fastconn.py         its connection (asyncio protocol, llhttp) and the exchange it carries
aiohttp_client.py   the reference client on aiohttp
"""

from llmgw.router.upstream.base import KEEPALIVE_S, Forwarder, UpstreamReply

__all__ = ["KEEPALIVE_S", "Forwarder", "UpstreamReply"]
