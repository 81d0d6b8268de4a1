"""Which peers count as this machine: the one loopback test every program uses."""

from __future__ import annotations

import ipaddress


def is_loopback(remote: str | None) -> bool:
    """Whether the peer is 127.0.0.0/8, ::1 or IPv4-mapped loopback (::ffff:127.0.0.1).

    A dual-stack socket (`--host ::`) sees a client of 127.0.0.1 as the mapped form.
    None (a unix socket) and anything unparsable are not: the question is about the
    network peer. A zone suffix (`::1%lo`) is ignored.
    """
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback
