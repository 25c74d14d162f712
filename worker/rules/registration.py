"""What an endpoint's registration may hold: the rules for its name, URL and custom headers, as pure
functions."""

from __future__ import annotations

import string
from collections.abc import Mapping
from urllib.parse import urlsplit

from worker.rules.destinations import DestinationRules, url_problem

# Set by webhook-worker on every request (and sendable_headers() drops any stored header these rules
# refuse, so none of them is ever sent either).
PRODUCT_HEADERS = frozenset(
    {
        "content-type", "content-length", "user-agent", "host", "webhook-id", "webhook-timestamp",
        "webhook-signature", "idempotency-key", "webhook-delivery-id", "webhook-attempt",
        "webhook-event-type", "traceparent",
    }
)
# Framing and hop-by-hop headers (RFC 9110 7.6.1, RFC 9112 6-7): they say how this connection and
# this body are carried, which is the HTTP client's business. A Transfer-Encoding beside the
# client's Content-Length is the shape of request smuggling; Host would send the request to a
# virtual host other than the one the destination rules checked.
FRAMING_HEADERS = frozenset(
    {"transfer-encoding", "content-length", "connection", "keep-alive", "te", "trailer", "upgrade",
     "host", "expect"}
)
# Proxy-Authorization, Proxy-Connection and the rest speak to a proxy, never to the receiver.
RESERVED_PREFIXES = ("proxy-",)
# The longest URL an endpoint is registered with (docs/delivery.md, "Registration checks"). Only registration
# applies it: a longer URL stored before it existed is still delivered to (destinations.url_problem's
# own bound, for every delivery, is far larger).
MAX_URL_CHARS = 2048
MAX_HEADERS = 50
MAX_NAME_CHARS = 256
MAX_VALUE_CHARS = 8192
# RFC 9110 5.6.2: a field name is a token.
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
# RFC 9110 5.5: visible ASCII, space and tab (obs-text is refused: receivers read it inconsistently).
VALUE_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) | {"\t"}


MAX_ENDPOINT_NAME_CHARS = 200


def endpoint_name_problem(name: str) -> str | None:
    """What is wrong with an endpoint's name, or None. All digits is refused because an ENDPOINT
    argument of all digits always means an id (sql: endpoints_name_not_numeric, endpoint_ref())."""
    if not name.strip():
        return "must not be empty"
    if len(name) > MAX_ENDPOINT_NAME_CHARS:
        return f"at most {MAX_ENDPOINT_NAME_CHARS} characters"
    if not name.isprintable():
        return "must be printable"
    if name.isascii() and name.isdigit():
        return "must not be all digits (an all-digit ENDPOINT always means an id)"
    return None


def registration_url_problem(url: str, rules: DestinationRules) -> str | None:
    """Why an endpoint cannot be registered with this URL, or None: its length, then the destination
    rules (its form, an IP literal). The message never contains the URL."""
    if len(url) > MAX_URL_CHARS:
        return f"URL longer than {MAX_URL_CHARS:,} characters (it has {len(url):,})"
    return url_problem(url, rules)


def is_reserved(name: str) -> bool:
    """Whether a header name is one an endpoint's custom headers may not set."""
    lowered = name.lower()
    return lowered in PRODUCT_HEADERS or lowered in FRAMING_HEADERS or lowered.startswith(RESERVED_PREFIXES)


def header_problem(name: str, value: str) -> str | None:
    """Why this custom header cannot be registered, or None. The message never contains the value
    (it may be a credential), and names the header only once its name is known to be a token."""
    if not name:
        return "a header name must not be empty"
    if len(name) > MAX_NAME_CHARS or not set(name) <= TOKEN_CHARS:
        return ("a header name must be an HTTP token (RFC 9110): ASCII letters, digits and "
                "!#$%&'*+-.^_`|~, without spaces")
    if name.lower() in PRODUCT_HEADERS:
        return f"{name}: set by webhook-worker on every request, cannot be overridden"
    if name.lower() in FRAMING_HEADERS or name.lower().startswith(RESERVED_PREFIXES):
        return f"{name}: a framing, hop-by-hop or proxy header, set by the HTTP client only"
    if not isinstance(value, str):
        return f"{name}: the value must be text"
    if len(value) > MAX_VALUE_CHARS:
        return f"{name}: the value is longer than {MAX_VALUE_CHARS} characters"
    if not set(value) <= VALUE_CHARS:
        if any(not c.isascii() for c in value):
            return f"{name}: the value must be ASCII (percent-encode other characters)"
        return f"{name}: control characters (line breaks included) are not allowed in the value"
    if value != value.strip(" \t"):
        return f"{name}: the value must not start or end with spaces"
    return None


def sendable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The stored headers these rules allow: headers stored before a rule existed (a
    Transfer-Encoding beside the client's Content-Length, a name that is no HTTP token) are never
    sent."""
    return {name: value for name, value in headers.items() if header_problem(name, value) is None}


def headers_problem(url: str, headers: Mapping[str, str]) -> str | None:
    """Why this set of custom headers cannot go with this URL, or None."""
    if len(headers) > MAX_HEADERS:
        return f"at most {MAX_HEADERS} custom headers"
    seen: set[str] = set()
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem is not None:
            return problem
        if name.lower() in seen:
            return f"{name}: given twice (header names are case-insensitive)"
        seen.add(name.lower())
    if "authorization" in seen and url_has_userinfo(url):
        # aiohttp refuses a request with both, so every attempt would fail as `internal`.
        return ("Authorization: the URL carries credentials (user:password@host) as well; give them in "
                "one place only")
    return None


def url_has_userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None
