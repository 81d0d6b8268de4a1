"""How the router talks to engines: the seam (`base`), two clients (`fast`, `aiohttp_client`)."""

from llmgw.router.upstream.base import KEEPALIVE_S, Forwarder, UpstreamReply

__all__ = ["KEEPALIVE_S", "Forwarder", "UpstreamReply"]
