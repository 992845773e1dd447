"""Addresses of this machine: resolve a hostname to an IP that accepts TCP.

``AddrType`` chooses the address family: ``IPv4``, ``IPv6``, or ``Default`` (IPv6 when
the name has one, else IPv4). :mod:`monarch.spmd` uses it for ``MASTER_ADDR``.
``get_consistent_sockaddr`` picks the address every machine resolving a name agrees on.
"""

from monarch._src.spmd.network import (
    AddrType,
    get_consistent_sockaddr,
    get_ipaddr,
    get_sockaddr,
)

__all__ = ["AddrType", "get_consistent_sockaddr", "get_ipaddr", "get_sockaddr"]
