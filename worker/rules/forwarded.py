"""Which address a request comes from, and where its client reached the API: the peer and the
request itself, or behind a trusted proxy what the proxy says."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from worker.rules import wording

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
UNKNOWN = "unknown"


def network_problem(entry: str) -> str | None:
    """What is wrong with an entry of a list of networks (an address or a CIDR), or None."""
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return f"{wording.json_text(entry)} is not an address or a CIDR such as 10.0.0.0/8 or fd00::/8"
    return None


def networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Entries already checked by `network_problem`; a bare address is a network of one."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def client_address(peer: str | None, forwarded_for: Sequence[str], forwarded: Sequence[str],
                   trusted: Sequence[Network]) -> str:
    """The address to count a request's failures against.

    `peer` is the socket's remote address; `forwarded_for` the request's X-Forwarded-For header
    lines and `forwarded` its RFC 7239 Forwarded lines. The headers are believed only when the peer
    is a trusted proxy: anyone else could name any address and so dodge the limit or aim it at
    someone else. Each proxy appends the address it received from, so the right-most entry that is
    not itself a trusted proxy is the client; entries left of it were written by the client and
    are never read. Anything unreadable on the way there, or the two headers naming different
    clients (a proxy appends to one of them; the other may come from the client), gives the peer.
    """
    peer_address = _address(peer) if peer else None
    if peer_address is None:
        return peer or UNKNOWN
    if not _within(peer_address, trusted):
        return str(peer_address)
    chosen = {_rightmost_untrusted(entries, trusted)
              for entries in (_forwarded_for_entries(forwarded_for), _forwarded_entries(forwarded))
              if entries is None or entries}
    if len(chosen) != 1 or None in chosen:
        # no header (the proxy forwarded nothing), two headers in disagreement, or an unreadable one
        return str(peer_address)
    return str(chosen.pop())


def _rightmost_untrusted(entries: list[Address | None] | None,
                         trusted: Sequence[Network]) -> Address | None:
    if entries is None:
        return None
    for entry in reversed(entries):
        if entry is None:
            return None  # unreadable before the client was found: the chain cannot be followed
        if not _within(entry, trusted):
            return entry
    return entries[0]  # every hop a trusted proxy: the request started at the first


def _within(address: Address, trusted: Sequence[Network]) -> bool:
    return any(address in network for network in trusted)


def _forwarded_for_entries(lines: Sequence[str]) -> list[Address | None] | None:
    """X-Forwarded-For: comma-separated addresses over any number of lines; [] when absent."""
    entries = [part for line in lines for part in line.split(",")]
    if entries and not any(part.strip() for part in entries):
        return None
    return [_address(part) for part in entries if part.strip()]


def _forwarded_entries(lines: Sequence[str]) -> list[Address | None] | None:
    """RFC 7239: comma-separated elements of `;`-separated pairs; the `for=` of each. An element
    without one, `for=unknown` or an obfuscated name stands for no address: None in its place."""
    entries: list[Address | None] = []
    for line in lines:
        for element in line.split(","):
            if not element.strip():
                continue
            node = None
            for pair in element.split(";"):
                name, sep, value = pair.strip().partition("=")
                if not sep:
                    return None  # not name=value: the header cannot be read
                if name.strip().lower() == "for":
                    node = value.strip()
            entries.append(_address(node) if node else None)
    return entries


def _address(text: str) -> Address | None:
    """An address as proxies write it: bare, `[v6]`, either with a `:port`, perhaps quoted; an
    IPv4-mapped IPv6 address as the IPv4 address it maps."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].strip()
    host = text
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        if not port.isdigit():
            return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# A Host value: a name or an IPv4 address, or an IPv6 address in brackets, with a port perhaps.
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
                   r"(?::[0-9]{1,5})?$")


def forwarded_origin(peer: str | None, trusted: Sequence[Network], scheme: str, host: str | None,
                     forwarded_proto: Sequence[str], forwarded_host: Sequence[str]) -> str | None:
    """Where the client reached the API (`scheme://host[:port]`), as a trusted proxy in front says:
    its X-Forwarded-Proto and X-Forwarded-Host (the right-most value of each, the nearest proxy's),
    else the scheme and Host header it forwarded. None from a peer that is not a trusted proxy,
    since anyone may send those headers (a link made from them could point anywhere), or when what
    the proxy says is no scheme or host."""
    peer_address = _address(peer) if peer else None
    if peer_address is None or not _within(peer_address, trusted):
        return None
    proto = _last(forwarded_proto) or scheme
    where = _last(forwarded_host) or host or ""
    if proto.lower() not in ("http", "https") or _HOST.fullmatch(where) is None:
        return None
    return f"{proto.lower()}://{where}"


def _last(lines: Sequence[str]) -> str | None:
    values = [part.strip() for line in lines for part in line.split(",") if part.strip()]
    return values[-1] if values else None
