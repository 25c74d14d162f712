"""A host's addresses now, as a worker's connection would resolve them: the one DNS lookup outside
the sender, for the destination check when an endpoint is registered or its URL changed."""

from __future__ import annotations

import socket


def addresses(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to for a TCP connection to `port` (blocking); OSError when it does
    not resolve, UnicodeError when it cannot be written as a DNS name."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
