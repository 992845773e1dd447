"""Addresses of this machine: resolve a hostname to an IP that accepts TCP.

``AddrType`` chooses the address family: ``IPv4``, ``IPv6``, or ``Default`` (IPv6 when
the name has one, else IPv4). :mod:`monarch.spmd` uses it for ``MASTER_ADDR``.
"""

from __future__ import annotations

import ipaddress
import socket
from enum import Enum, auto

__all__ = ["AddrType", "get_consistent_sockaddr", "get_ipaddr", "get_sockaddr"]


class AddrType(Enum):
    """Which address family to resolve to."""

    #: IPv6 if the name has an IPv6 address, else IPv4.
    Default = auto()
    IPv4 = auto()
    IPv6 = auto()


_FAMILIES = {
    AddrType.Default: (socket.AF_INET6, socket.AF_INET),
    AddrType.IPv4: (socket.AF_INET,),
    AddrType.IPv6: (socket.AF_INET6,),
}


def _resolve(hostname: str, port: int, family: socket.AddressFamily) -> str | None:
    try:
        infos = socket.getaddrinfo(hostname, port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        # Link-local addresses (fe80::/10, 169.254.0.0/16) do not route beyond one
        # network segment: other processes usually cannot connect to them.
        if not ipaddress.ip_address(address.split("%")[0]).is_link_local:
            return address
    return None


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """An IP address of ``hostname`` (``"10.0.0.5"``, or ``"::1"`` for IPv6) of the
    family ``addr_type`` chooses.

    Raises:
        ValueError: ``addr_type`` is not an :class:`AddrType`.
        RuntimeError: ``hostname`` has no address of that family.
    """
    families = _FAMILIES.get(addr_type) if isinstance(addr_type, AddrType) else None
    if families is None:
        raise ValueError(f"get_ipaddr: expected an AddrType, got {addr_type!r}")
    for family in families:
        address = _resolve(hostname, port, family)
        if address is not None:
            return address
    wanted = " or ".join(f.name for f in families)
    raise RuntimeError(
        f"cannot resolve {hostname!r} to an {wanted} address that accepts TCP; check "
        "the machine's network configuration (/etc/hosts, DNS)"
    )


def get_sockaddr(hostname: str, port: int) -> str:
    """``hostname:port`` as a socket address: ``"[IPv6]:port"`` when the name has an
    IPv6 address, else ``"IPv4:port"``.

    Raises:
        RuntimeError: ``hostname`` resolves to neither.
    """
    address = get_ipaddr(hostname, port, AddrType.Default)
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def get_consistent_sockaddr(hostname: str, port: int) -> str:
    """``hostname:port`` as a socket address that every machine resolving ``hostname``
    agrees on, for an address one host advertises and others dial.

    Of the addresses ``hostname`` resolves to, those no peer can reach are dropped
    (loopback, link-local, with any ``%scope``), then the lowest IPv4 address is taken
    (``"10.0.0.5:8080"``), or, with none, the lowest IPv6 one (``"[2001:db8::5]:8080"``).
    The choice depends neither on the resolver's order nor on addresses only one host
    sees in addition (its own ``/etc/hosts`` giving it an IPv6 address its DNS record
    lacks, say): IPv4 is preferred whenever the name has one.

    Raises:
        RuntimeError: ``hostname`` resolves to no routable address.
    """
    try:
        infos = socket.getaddrinfo(hostname, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise RuntimeError(
            f"cannot resolve {hostname!r}: {e}; check the machine's network configuration "
            "(/etc/hosts, DNS)"
        ) from None
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for _family, _type, _proto, _name, sockaddr in infos:
        try:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        except ValueError:
            continue
        if not (
            address.is_loopback
            or address.is_link_local
            or address.is_unspecified
            or address.is_multicast
        ):
            found.add(address)
    v4 = sorted(a for a in found if isinstance(a, ipaddress.IPv4Address))
    if v4:
        return f"{v4[0]}:{port}"
    v6 = sorted(a for a in found if isinstance(a, ipaddress.IPv6Address))
    if v6:
        return f"[{v6[0]}]:{port}"
    seen = sorted({str(sockaddr[0]) for *_, sockaddr in infos})
    raise RuntimeError(
        f"cannot resolve {hostname!r} to a routable address: it resolves to {seen}, "
        "loopback or link-local only, which other machines cannot reach; give the host a "
        "routable address in /etc/hosts or DNS"
    )
