"""Which receivers the http target refuses unless ``PM_HTTP_ALLOW_PRIVATE`` is true: a host that
is, or resolves to, a loopback, link-local, private, shared, multicast, reserved or unspecified
address. In a multi-user API, a schedule's URL must not reach the manager's own network (SSRF).

At write time only what the URL says is judged (an IP literal, ``localhost``): resolving names
there would make every cold start of the judge wait on DNS. Names are resolved when a request is
sent, and every address they resolve to is judged (:func:`refusal_of_resolved`), on every
request, redirects included.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

LOCAL_NAMES = ("localhost", "localhost.localdomain")


def private_address(address: str) -> bool:
    """Whether the IP ``address`` is one no public receiver has (see the module doc)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED)
    )


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT


def literal_refusal(host: str) -> str | None:
    """Why ``host`` (as a URL writes it) is refused without resolving it (None: not here)."""
    bare = host.strip("[]").rstrip(".").lower()
    if bare in LOCAL_NAMES or bare.endswith(".localhost"):
        return f"host {host!r} is this machine"
    if private_address(bare):
        return f"host {host!r} is a private, loopback or link-local address"
    return None


async def refusal_of_resolved(host: str, port: int) -> str | None:
    """Why a request to ``host`` is refused: it is, or resolves to, a private address (None:
    every address it resolves to is public). OSError when it cannot be resolved."""
    why = literal_refusal(host)
    if why is not None:
        return why
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
        return None  # a public literal
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    for info in infos:
        address = str(info[4][0])
        if private_address(address):
            return f"host {host!r} resolves to {address}, a private, loopback or link-local address"
    return None
