"""SSRF rules: which addresses and URLs a delivery may go to, and how a refusal becomes a dead letter."""

import ipaddress
import socket

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.daemon.sender import checked_socket_factory, transport_failure
from worker.rules.classification import AttemptResult, Category, Outcome, classify
from worker.rules.destinations import (
    MAX_URL_LENGTH,
    BlockedDestination,
    DestinationRules,
    address_blocked,
    embedded_ipv4,
    granted_networks,
    ip_literal,
    refused_as_private,
    tenant_destinations,
    url_problem,
)
from worker.rules.redaction import display_url

DEFAULT = DestinationRules()
LOOPBACK_ONLY = DestinationRules.from_settings(True, ["127.0.0.1/32"], False)
OPEN = DestinationRules.from_settings(False, [], False)

BLOCKED = [
    "127.0.0.1",
    "127.1.2.3",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    pytest.param("169.254.169.254", id="cloud-metadata"),
    pytest.param("100.64.0.1", id="cgnat"),
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "192.0.2.1",
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    pytest.param("fe80::1%eth0", id="link-local-with-zone"),
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    pytest.param("64:ff9b::7f00:1", id="nat64-of-loopback"),
    pytest.param("64:ff9b::a00:1", id="nat64-of-private"),
    pytest.param("64:ff9b:1::1", id="nat64-local-use"),
    pytest.param("2002:7f00:1::", id="6to4-of-loopback"),
    pytest.param("2001::1", id="teredo"),
    "2001:db8::1",
]

ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    pytest.param("64:ff9b::808:808", id="nat64-of-public"),
    pytest.param("2002:808:808::", id="6to4-of-public"),
]


@pytest.mark.parametrize("address", BLOCKED)
def test_default_policy_blocks_non_public_addresses(address):
    reason = address_blocked(address, DEFAULT)
    assert reason is not None
    assert "public" in reason


@pytest.mark.parametrize("address", ALLOWED)
def test_default_policy_allows_public_addresses(address):
    assert address_blocked(address, DEFAULT) is None


def test_address_blocked_accepts_address_objects_as_well_as_text():
    assert address_blocked(ipaddress.ip_address("10.0.0.1"), DEFAULT) is not None
    assert address_blocked(ipaddress.ip_address("8.8.8.8"), DEFAULT) is None


def test_the_reason_for_an_embedded_address_names_the_ipv4_it_stands_for():
    assert "127.0.0.1" in address_blocked("64:ff9b::7f00:1", DEFAULT)


# Python's ipaddress marks these global, but they are outside 2000::/3 (global unicast) and are
# "reserved" in its own sense (IPv6Address.is_reserved), which SecurityConfig promises to refuse.
@pytest.mark.parametrize(
    "address",
    [
        pytest.param("fec0::1", id="site-local"),
        pytest.param("::7f00:1", id="ipv4-compatible-loopback"),
        pytest.param("::a00:1", id="ipv4-compatible-private"),
        pytest.param("::ffff:0:7f00:1", id="ipv4-translated-loopback"),
        pytest.param("4000::1", id="unassigned"),
    ],
)
def test_default_policy_blocks_reserved_ipv6_space(address):
    assert address_blocked(address, DEFAULT) is not None


@pytest.mark.parametrize("address", ["127.0.0.1", "::ffff:127.0.0.1"])
def test_an_allowlisted_network_is_allowed(address):
    assert address_blocked(address, LOOPBACK_ONLY) is None


@pytest.mark.parametrize("address", ["127.0.0.2", "10.0.0.1", "::1", "169.254.169.254"])
def test_an_allowlist_does_not_open_other_private_addresses(address):
    assert address_blocked(address, LOOPBACK_ONLY) is not None


def test_an_ipv6_allowlist_entry_allows_its_own_network():
    policy = DestinationRules.from_settings(True, ["fd00:1234::/32"], False)
    assert address_blocked("fd00:1234::5", policy) is None
    assert address_blocked("fd00:1235::5", policy) is not None


def test_allowlist_entries_with_host_bits_are_accepted():
    policy = DestinationRules.from_settings(True, ["10.20.1.5/16"], False)
    assert address_blocked("10.20.200.1", policy) is None


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "ff02::1", "8.8.8.8"])
def test_block_private_false_allows_everything(address):
    assert address_blocked(address, OPEN) is None


REFUSED_URLS = [
    pytest.param("file:///etc/passwd", "scheme", id="file"),
    pytest.param("gopher://127.0.0.1:25/", "scheme", id="gopher"),
    pytest.param("ftp://x.test/", "scheme", id="ftp"),
    pytest.param("javascript:alert(1)", "scheme", id="javascript"),
    pytest.param("hooks.example.com/x", "scheme", id="no-scheme"),
    pytest.param("http:///path", "no host", id="no-host"),
    pytest.param("https://", "no host", id="empty-authority"),
    pytest.param("http://x.test/a b", "whitespace", id="space"),
    pytest.param("http://x.test/a\r\nHost: evil", "whitespace", id="crlf"),
    pytest.param("http://x.test/a\nb", "whitespace", id="lf"),
    pytest.param("http://x.test/a\x00b", "control", id="nul"),
    pytest.param("http://x.test:99999/", "not a valid URL", id="bad-port"),
    pytest.param("http://x.test:port/", "not a valid URL", id="non-numeric-port"),
    pytest.param("http://[::1/", "not a valid URL", id="unclosed-bracket"),
    pytest.param("http://127.0.0.1/", "public", id="loopback"),
    pytest.param("http://[::1]/", "public", id="ipv6-loopback"),
    pytest.param("http://[::ffff:127.0.0.1]/", "public", id="mapped-loopback"),
    pytest.param("http://[fe80::1%25eth0]/", "public", id="link-local-zone"),
    pytest.param("http://2130706433/", "public", id="decimal-loopback"),
    pytest.param("http://0177.0.0.1/", "public", id="octal-loopback"),
    pytest.param("http://0x7f.1/", "public", id="hex-loopback"),
    pytest.param("http://127.1/", "public", id="short-loopback"),
    pytest.param("http://169.254.169.254/latest/meta-data/", "public", id="cloud-metadata"),
    pytest.param("https://user:pw@10.1.2.3:8443/hook", "public", id="private-with-userinfo"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED_URLS)
def test_url_problem_refuses(url, reason):
    problem = url_problem(url, DEFAULT)
    assert problem is not None
    assert reason in problem


def test_url_problem_refuses_a_url_longer_than_the_limit():
    url = "https://example.com/" + "a" * (MAX_URL_LENGTH - len("https://example.com/") + 1)
    assert len(url) == MAX_URL_LENGTH + 1
    problem = url_problem(url, DEFAULT)
    assert problem is not None and "8192" in problem


def test_url_problem_accepts_a_url_of_exactly_the_limit():
    url = "https://example.com/" + "a" * (MAX_URL_LENGTH - len("https://example.com/"))
    assert url_problem(url, DEFAULT) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com/services/T/B/X",
        # Credentials in userinfo are allowed: sealed at rest and kept out of logs.
        "http://user:pass@example.com/hook",
        "https://[2606:4700::1]/",
        "https://8.8.8.8:8443/hook?x=1#frag",
        "HTTPS://EXAMPLE.COM/",
        "http://localhost/",  # a name: checked when it resolves, at delivery time
    ],
)
def test_url_problem_accepts(url):
    assert url_problem(url, DEFAULT) is None


def test_url_problem_with_an_allowlist_accepts_the_allowed_literal():
    assert url_problem("http://127.0.0.1:8080/hook", LOOPBACK_ONLY) is None
    assert url_problem("http://127.0.0.2:8080/hook", LOOPBACK_ONLY) is not None


def test_require_https_refuses_plain_http():
    policy = DestinationRules.from_settings(True, [], True)
    problem = url_problem("http://example.com/", policy)
    assert problem is not None and "https" in problem
    assert url_problem("https://example.com/", policy) is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.0.0.1", "10.0.0.1"),
        ("::1", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("example.com", None),
        ("deadbeef.example", None),
        ("abc", None),
        ("", None),
    ],
)
def test_ip_literal(host, expected):
    result = ip_literal(host)
    assert (None if result is None else str(result)) == expected


def test_embedded_ipv4_reads_mapped_nat64_and_6to4_forms():
    assert str(embedded_ipv4(ipaddress.ip_address("::ffff:1.2.3.4"))) == "1.2.3.4"
    assert str(embedded_ipv4(ipaddress.ip_address("64:ff9b::102:304"))) == "1.2.3.4"
    assert str(embedded_ipv4(ipaddress.ip_address("2002:102:304::1"))) == "1.2.3.4"
    assert embedded_ipv4(ipaddress.ip_address("2606:4700::1")) is None
    assert embedded_ipv4(ipaddress.ip_address("1.2.3.4")) is None


def test_display_url_drops_userinfo_path_and_query():
    shown = display_url("https://user:SECRET@hooks.example.com:8443/p/SECRET?t=SECRET#SECRET")
    assert "SECRET" not in shown
    assert "user" not in shown
    assert shown == "https://hooks.example.com:8443"


def test_display_url_brackets_an_ipv6_host():
    assert display_url("http://[2606:4700::1]:8080/x") == "http://[2606:4700::1]:8080"


def test_display_url_of_an_invalid_url_hides_it():
    assert display_url("http://SECRET:99999999/") == "(invalid URL)"


def test_a_blocked_attempt_is_dead_lettered_as_blocked():
    decision = classify(AttemptResult(failure=Category.BLOCKED, error="destination 10.0.0.1 is not public"))
    assert decision.outcome is Outcome.DEAD_LETTER
    assert decision.category is Category.BLOCKED
    assert decision.reason == "destination 10.0.0.1 is not public"
    assert not decision.disable_endpoint


def test_a_blocked_attempt_without_an_error_still_has_a_reason():
    decision = classify(AttemptResult(failure=Category.BLOCKED))
    assert decision.outcome is Outcome.DEAD_LETTER and decision.reason


LOOPBACK_ADDR_INFO = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))


def test_checked_socket_factory_refuses_a_blocked_address():
    make = checked_socket_factory(DEFAULT)
    with pytest.raises(BlockedDestination, match=r"127\.0\.0\.1"):
        make(LOOPBACK_ADDR_INFO)


def test_checked_socket_factory_refuses_a_mapped_ipv6_address():
    make = checked_socket_factory(DEFAULT)
    addr_info = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:127.0.0.1", 80, 0, 0))
    with pytest.raises(BlockedDestination):
        make(addr_info)


def test_checked_socket_factory_returns_a_socket_for_an_allowed_address():
    make = checked_socket_factory(LOOPBACK_ONLY)
    sock = make(LOOPBACK_ADDR_INFO)
    try:
        assert isinstance(sock, socket.socket)
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
    finally:
        sock.close()


def test_blocked_destination_is_an_os_error():
    # aiohttp wraps OSErrors from the socket factory in ClientConnectorError, keeping the original.
    assert issubclass(BlockedDestination, OSError)


def test_transport_failure_of_a_wrapped_blocked_destination_is_blocked():
    error = aiohttp.ClientConnectorError(None, BlockedDestination("destination 127.0.0.1 is not public"))
    category, message = transport_failure(error)
    assert category is Category.BLOCKED
    assert message == "destination 127.0.0.1 is not public"


def test_transport_failure_of_a_bare_blocked_destination_is_blocked():
    category, message = transport_failure(BlockedDestination("destination 10.0.0.1 is not public"))
    assert category is Category.BLOCKED
    assert "10.0.0.1" in message


def test_transport_failure_of_another_connector_error_is_connect():
    error = aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "Connection refused"))
    category, message = transport_failure(error)
    assert category is Category.CONNECT
    assert "Connection refused" in message


ipv4_addresses = st.ip_addresses(v=4)


@given(ipv4_addresses)
@settings(max_examples=200, deadline=None)
def test_an_ipv4_mapped_address_is_judged_as_its_ipv4_address(address):
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert (address_blocked(mapped, DEFAULT) is None) == (address_blocked(address, DEFAULT) is None)


@given(ipv4_addresses)
@settings(max_examples=200, deadline=None)
def test_a_nat64_address_is_judged_as_its_ipv4_address(address):
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(address))
    assert embedded_ipv4(nat64) == address
    assert (address_blocked(nat64, DEFAULT) is None) == (address_blocked(address, DEFAULT) is None)


@given(ipv4_addresses)
@settings(max_examples=200, deadline=None)
def test_a_6to4_address_is_judged_as_its_ipv4_address(address):
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (int(address) << 80) | 1)
    assert (address_blocked(six_to_four, DEFAULT) is None) == (address_blocked(address, DEFAULT) is None)


@given(st.ip_addresses(), st.sampled_from([DEFAULT, LOOPBACK_ONLY, OPEN]))
@settings(max_examples=200, deadline=None)
def test_address_blocked_never_raises_and_answers_none_or_a_reason(address, policy):
    for form in (address, str(address)):
        reason = address_blocked(form, policy)
        assert reason is None or isinstance(reason, str)


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_url_problem_never_raises_for_any_text(url):
    problem = url_problem(url, DEFAULT)
    assert problem is None or isinstance(problem, str)


@given(
    st.sampled_from(["http", "https", "ftp", "HTTP", ""]),
    st.text(max_size=40),
    st.text(max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_url_problem_never_raises_for_url_shaped_text(scheme, authority, rest):
    problem = url_problem(f"{scheme}://{authority}/{rest}", DEFAULT)
    assert problem is None or isinstance(problem, str)


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_display_url_never_raises(url):
    assert isinstance(display_url(url), str)


# --- the edges mutants showed untested ---------------------------------------------------------------


def test_turning_block_private_off_allows_private_addresses():
    # made here, not at import: what the settings give now is what is checked
    policy = DestinationRules.from_settings(False, [], False)
    assert policy.block_private is False
    assert address_blocked("10.0.0.1", policy) is None
    assert url_problem("http://127.0.0.1:8080/", policy) is None


def test_an_address_with_an_ipv6_zone_id_is_judged_without_it():
    assert address_blocked("fe80::1%eth0", DEFAULT) == "destination fe80::1 is not a public address"


def test_a_legacy_ipv4_literal_in_capitals_is_still_an_address():
    assert ip_literal("0X7F.1") == ipaddress.ip_address("127.0.0.1")
    assert url_problem("http://0X7F.1/", DEFAULT) == "destination 127.0.0.1 is not a public address"


@pytest.mark.parametrize(("url", "policy", "problem"), [
    ("http://x.test:99999/", DEFAULT, "not a valid URL"),
    ("x.test/a", DEFAULT, "scheme '(none)' is not allowed: only http and https"),
    ("http://x.test/", DestinationRules(require_https=True), "https is required (security.require_https)"),
    ("http:///a", DEFAULT, "URL has no host"),
    ("http://x.test/a b", DEFAULT, "URL contains whitespace or control characters"),
])
def test_each_url_problem_reads_in_full(url, policy, problem):
    assert url_problem(url, policy) == problem


# --- whose networks -----------------------------------------------------------------------------------

OPERATOR = DestinationRules.from_settings(True, ["10.9.0.0/16"], False)


def test_the_default_tenants_endpoints_reach_the_operators_networks_and_no_other_tenants_do():
    ours = tenant_destinations(OPERATOR, "default", [])
    assert ours is OPERATOR and address_blocked("10.9.0.1", ours) is None
    theirs = tenant_destinations(OPERATOR, "acme", [])
    assert theirs.tenant_scoped and theirs.allow == ()
    assert address_blocked("10.9.0.1", theirs) == (
        "destination 10.9.0.1 is not allowed for this tenant: not a public address, nor in a network "
        "granted to the tenant")
    assert address_blocked("8.8.8.8", theirs) is None  # public destinations stay open
    granted = tenant_destinations(OPERATOR, "acme", ["10.1.0.0/16"])
    assert address_blocked("10.1.2.3", granted) is None
    assert address_blocked("::ffff:10.1.2.3", granted) is None  # the forms that stand for it too
    assert address_blocked("10.9.0.1", granted) is not None
    # a grant to the default tenant adds to the operator's
    both = tenant_destinations(OPERATOR, "default", ["10.1.0.0/16"])
    assert address_blocked("10.1.2.3", both) is None and address_blocked("10.9.0.1", both) is None


def test_the_operators_allowances_are_never_a_tenants():
    anything = DestinationRules.from_settings(False, [], True)  # block_private_networks: false
    assert address_blocked("10.0.0.1", tenant_destinations(anything, "default", [])) is None
    theirs = tenant_destinations(anything, "acme", [])
    assert address_blocked("10.0.0.1", theirs) is not None
    granted = tenant_destinations(anything, "acme", ["10.0.0.0/8"])
    assert address_blocked("169.254.169.254", granted) is not None
    # a restriction holds for everyone
    assert url_problem("http://hooks.example.test/", theirs) == "https is required (security.require_https)"


def test_networks_are_granted_as_networks_and_anything_else_is_refused_naming_it():
    assert granted_networks(["10.1.2.3/16", " 127.0.0.1", "fd00::1", "10.1.0.0/16"]) == [
        "10.1.0.0/16", "127.0.0.1/32", "fd00::1/128"]
    assert granted_networks([]) == []
    for bad in ("intranet", "10.0.0.0/33", "10.0.0.1/8/8", ""):
        with pytest.raises(ValueError, match="is not an address or a CIDR"):
            granted_networks([bad])
    with pytest.raises(ValueError, match="at most 100 networks"):
        granted_networks([f"10.0.{i}.0/24" for i in range(101)])
    assert len(granted_networks([f"10.0.{i}.0/24" for i in range(100)])) == 100  # the bound itself is fine
    long = "x" * 100
    with pytest.raises(ValueError) as refused:
        granted_networks([long])
    assert str(refused.value) == f"{'x' * 60!r} is not an address or a CIDR such as 10.1.0.0/16"


def test_a_network_granted_with_host_bits_is_its_network():
    # as granted_networks() writes them, and as an operator may have stored them by hand
    granted = tenant_destinations(OPERATOR, "acme", ["10.1.2.3/16"])
    assert granted.allow == (ipaddress.ip_network("10.1.0.0/16"),)
    assert address_blocked("10.1.200.1", granted) is None


def test_only_a_refusal_of_a_private_address_is_one_a_granted_network_would_lift():
    rules = tenant_destinations(OPERATOR, "acme", [])
    assert refused_as_private(address_blocked("10.9.0.1", rules) or "")
    assert refused_as_private(address_blocked("10.9.0.1", DEFAULT) or "")
    for problem in ("https is required (security.require_https)", "URL has no host", "not a valid URL"):
        assert not refused_as_private(problem)


def test_a_host_with_anything_after_an_ipv4_literal_is_a_name_not_that_address():
    # the C resolver's inet_aton() reads "127.0.0.1 anything" as 127.0.0.1: only the characters of
    # the legacy forms are read as an address
    assert ip_literal("127.0.0.1 evil") is None
    assert ip_literal("127.1 x") is None
