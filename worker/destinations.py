"""Where a delivery may go: SSRF rules for URLs and for the addresses actually connected to. No I/O.

A webhook URL is chosen by whoever registers the endpoint, so without these rules a worker inside a
private network is a proxy into it (the cloud metadata service, the database, an admin port). The
rules are applied twice: to the URL when it is stored, and to every address the HTTP client is about
to connect to, after DNS. The second check is the one that counts: a name that resolved to a public
address when it was registered can resolve to 127.0.0.1 at delivery time (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 8192
# Ranges Python's ipaddress does not mark as non-global (or marks global) that must still be refused.
_EXTRA_BLOCKED: tuple[Network, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),  # CGNAT (shared address space)
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64, local use
    ipaddress.ip_network("2001::/32"),  # Teredo: the IPv4 client inside cannot be checked
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# The only IPv6 space assigned for global unicast; everything else (site-local, IPv4-compatible and
# -translated forms, unassigned space) is refused outright.
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


class BlockedDestination(OSError):
    """Raised in place of a connection to a refused address; the attempt fails as `blocked`."""


@dataclass(frozen=True)
class DestinationPolicy:
    block_private: bool = True
    allow: tuple[Network, ...] = ()
    require_https: bool = False

    @classmethod
    def from_settings(
        cls, block_private: bool, allow_networks: Iterable[str], require_https: bool
    ) -> DestinationPolicy:
        allow = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        return cls(block_private=block_private, allow=allow, require_https=require_https)


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 IPv6 address."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    return None


def _special(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST:
        return True
    return (
        not address.is_global
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
        or address.is_loopback
        or address.is_link_local
        or any(address in network for network in _EXTRA_BLOCKED if network.version == address.version)
    )


def address_blocked(address: Address | str, policy: DestinationPolicy) -> str | None:
    """Why a connection to this address is refused, or None when it is allowed."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.partition("%")[0])  # drop an IPv6 zone id
    inner = embedded_ipv4(address)
    candidates = (address, inner) if inner is not None else (address,)
    if any(c in network for c in candidates for network in policy.allow if network.version == c.version):
        return None
    if not policy.block_private:
        return None
    if inner is not None:
        # Judge the IPv4 address it stands for (a NAT64 form of a public address is public).
        if _special(inner):
            return f"destination {address} (stands for {inner}) is not a public address"
        return None
    if _special(address):
        return f"destination {address} is not a public address"
    return None


def url_problem(url: str, policy: DestinationPolicy) -> str | None:
    """Why this URL can never be delivered to, or None. Checks the form and any IP literal; names
    are checked when they resolve, at delivery time."""
    if len(url.encode()) > MAX_URL_LENGTH:
        return f"URL longer than {MAX_URL_LENGTH} bytes"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not allowed: only http and https"
    if policy.require_https and parts.scheme != "https":
        return "https is required (security.require_https)"
    if not host:
        return "URL has no host"
    if any(c in url for c in "\r\n\t\x00 "):
        return "URL contains whitespace or control characters"
    literal = ip_literal(host)
    return None if literal is None else address_blocked(literal, policy)


def ip_literal(host: str) -> Address | None:
    """The address a host names by itself, including the legacy IPv4 forms resolvers accept
    (`2130706433`, `0177.0.0.1`, `0x7f.1`), or None for a name."""
    try:
        return ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None
