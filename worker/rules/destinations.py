"""Where a delivery may go: SSRF rules for URLs and for the addresses actually connected to, and
whose networks an endpoint may reach. No I/O.

A webhook URL is chosen by whoever registers the endpoint, so without these rules a worker inside a
private network is a proxy into it (the cloud metadata service, the database, an admin port). The
rules are applied twice: to the URL when it is stored, and to every address the HTTP client is about
to connect to, after DNS. The second check is the one that counts: a name that resolved to a public
address when it was registered can resolve to 127.0.0.1 at delivery time (DNS rebinding).

Networks belong to whom the operator gives them. The operator's own endpoints, those of the
`default` tenant, reach what the configuration allows (security.allow_networks,
security.block_private_networks). Any other tenant's endpoints reach public destinations and the
networks the operator granted that tenant (tenants.allow_networks), never the operator's: a
tenant's administrator or a portal customer registers URLs, and reads the answers in the
deliveries' excerpts (tenant_destinations()). The CLI, the API, the console and the worker all ask
tenant_destinations().
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, replace
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


# The tenant whose endpoints are the operator's own: every endpoint of a deployment without tenants.
OPERATOR_TENANT = "default"
# Networks granted to one tenant, at most (the constraint tenant_allow_networks_bounded repeats it).
MAX_GRANTED_NETWORKS = 100


@dataclass(frozen=True)
class DestinationRules:
    block_private: bool = True
    allow: tuple[Network, ...] = ()
    require_https: bool = False
    # A tenant's endpoints (not the operator's): a refusal says the destination is not allowed for
    # the tenant, and never points at the operator's configuration.
    tenant_scoped: bool = False

    @classmethod
    def from_settings(
        cls, block_private: bool, allow_networks: Iterable[str], require_https: bool
    ) -> DestinationRules:
        allow = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        return cls(block_private=block_private, allow=allow, require_https=require_https)


def tenant_destinations(operator: DestinationRules, tenant: str, granted: Iterable[Network | str]
                        ) -> DestinationRules:
    """Where an endpoint of `tenant` may deliver: the `default` tenant's endpoints are the
    operator's, and reach what `operator` (the configuration's rules) allows, plus any networks
    granted to that tenant; any other tenant's reach public destinations and the networks granted
    to it, never the operator's allowances (allow_networks, block_private_networks: false).
    require_https holds for every endpoint."""
    networks = tuple(n if not isinstance(n, str) else ipaddress.ip_network(n, strict=False) for n in granted)
    if tenant == OPERATOR_TENANT:
        return replace(operator, allow=operator.allow + networks) if networks else operator
    return DestinationRules(block_private=True, allow=networks, require_https=operator.require_https,
                             tenant_scoped=True)


def granted_networks(entries: Iterable[str]) -> list[str]:
    """The networks to grant a tenant, each as its network (`10.1.2.3/16` is `10.1.0.0/16`, a bare
    address a network of one), sorted and without repeats; ValueError naming the first entry that
    is no address or CIDR, or too many of them."""
    found: set[Network] = set()
    for entry in entries:
        try:
            found.add(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{entry.strip()[:60]!r} is not an address or a CIDR such as 10.1.0.0/16"
                             ) from None
    if len(found) > MAX_GRANTED_NETWORKS:
        raise ValueError(f"at most {MAX_GRANTED_NETWORKS} networks, not {len(found)}")
    return [str(n) for n in sorted(found, key=lambda n: (n.version, n))]


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


def address_blocked(address: Address | str, rules: DestinationRules) -> str | None:
    """Why a connection to this address is refused, or None when it is allowed."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.partition("%")[0])  # drop an IPv6 zone id
    inner = embedded_ipv4(address)
    candidates = (address, inner) if inner is not None else (address,)
    if any(c in network for c in candidates for network in rules.allow if network.version == c.version):
        return None
    if not rules.block_private:
        return None
    if inner is not None:
        # Judge the IPv4 address it stands for (a NAT64 form of a public address is public).
        if _special(inner):
            return _refusal(f"destination {address} (stands for {inner})", rules)
        return None
    if _special(address):
        return _refusal(f"destination {address}", rules)
    return None


def _refusal(destination: str, rules: DestinationRules) -> str:
    if rules.tenant_scoped:
        return (f"{destination} is not allowed for this tenant: not a public address, nor in a network "
                "granted to the tenant")
    return f"{destination} is not a public address"


def refused_as_private(problem: str) -> bool:
    """Whether a refusal is of a private address (which granting a network would allow), not of
    the URL's form."""
    return "not a public address" in problem


def url_problem(url: str, rules: DestinationRules) -> str | None:
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
    if rules.require_https and parts.scheme != "https":
        return "https is required (security.require_https)"
    if not host:
        return "URL has no host"
    if any(c in url for c in "\r\n\t\x00 "):
        return "URL contains whitespace or control characters"
    literal = ip_literal(host)
    return None if literal is None else address_blocked(literal, rules)


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
