"""Which address a request's failed authentications count against: the peer, or behind a trusted
proxy the client it names (worker/rules/forwarded.py), and the config key that lists the proxies."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.errors import ConfigError
from worker.rules.forwarded import client_address, forwarded_origin, networks

PROXIES = networks(["10.0.0.0/8", "fd00::/8", "192.0.2.1"])


def chosen(peer: str | None, xff: list[str] | None = None, fwd: list[str] | None = None,
           trusted=PROXIES) -> str:
    return client_address(peer, xff or [], fwd or [], trusted)


def test_from_an_untrusted_peer_the_headers_are_ignored():
    assert chosen("203.0.113.5", ["198.51.100.1"]) == "203.0.113.5"
    assert chosen("203.0.113.5", fwd=["for=198.51.100.1"]) == "203.0.113.5"
    # without any trusted proxy, not even a loopback peer is believed
    assert chosen("127.0.0.1", ["198.51.100.1"], trusted=()) == "127.0.0.1"


def test_from_a_trusted_proxy_the_rightmost_untrusted_entry_is_the_client():
    assert chosen("10.1.2.3", ["198.51.100.1"]) == "198.51.100.1"
    # what the client wrote itself sits left of what the proxy appended, and is not read
    assert chosen("10.1.2.3", ["6.6.6.6, 198.51.100.1"]) == "198.51.100.1"
    # proxies in a chain are skipped, whichever line they are on
    assert chosen("10.1.2.3", ["6.6.6.6, 198.51.100.1", "192.0.2.1, 10.9.9.9"]) == "198.51.100.1"
    assert chosen("fd00::1", ["2001:db8::7"]) == "2001:db8::7"
    # every hop a trusted proxy: the first one
    assert chosen("10.1.2.3", ["10.0.0.7, 10.0.0.8"]) == "10.0.0.7"


def test_the_forwarded_header_of_rfc_7239():
    assert chosen("10.1.2.3", fwd=["for=198.51.100.1;proto=https;by=10.1.2.3"]) == "198.51.100.1"
    assert chosen("10.1.2.3", fwd=['for=6.6.6.6, for="[2001:db8:cafe::17]:4711"']) == "2001:db8:cafe::17"
    assert chosen("10.1.2.3", fwd=['For="198.51.100.1:8080"', "for=10.0.0.9"]) == "198.51.100.1"


def test_both_headers_are_used_only_when_they_name_the_same_client():
    assert chosen("10.1.2.3", ["198.51.100.1"], ["for=198.51.100.1"]) == "198.51.100.1"
    # the proxy appends to one header; the other may be the client's own invention
    assert chosen("10.1.2.3", ["198.51.100.1"], ["for=6.6.6.6"]) == "10.1.2.3"


def test_ports_brackets_and_mapped_addresses_are_read_as_addresses():
    assert chosen("10.1.2.3", ["198.51.100.1:5555"]) == "198.51.100.1"
    assert chosen("10.1.2.3", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert chosen("10.1.2.3", ["::ffff:198.51.100.1"]) == "198.51.100.1"
    # a peer on a dual-stack socket is matched against IPv4 proxies as the IPv4 address it maps
    assert chosen("::ffff:10.1.2.3", ["198.51.100.1"]) == "198.51.100.1"
    assert chosen("::ffff:203.0.113.5", ["198.51.100.1"]) == "203.0.113.5"


@pytest.mark.parametrize(
    ("xff", "fwd"),
    [
        (["not-an-address"], None),
        (["6.6.6.6, garbage"], None),  # unreadable right of the client: the chain cannot be followed
        (["198.51.100.1:port"], None),
        (["[2001:db8::1"], None),
        ([" , "], None),
        (None, ["for=unknown"]),
        (None, ["for=_hidden"]),
        (None, ["proto=https"]),
        (None, ["for"]),
        (None, ['for="[2001:db8::1]:x"']),
    ],
)
def test_unreadable_values_give_the_peer(xff, fwd):
    assert chosen("10.1.2.3", xff, fwd) == "10.1.2.3"


def test_a_client_left_of_unreadable_text_is_still_found_when_nothing_right_of_it_is():
    assert chosen("10.1.2.3", ["garbage, 198.51.100.1"]) == "198.51.100.1"


def test_a_trusted_proxy_that_forwards_nothing_is_the_client_and_no_peer_is_unknown():
    assert chosen("10.1.2.3") == "10.1.2.3"
    assert chosen(None, ["198.51.100.1"]) == "unknown"


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text("database:\n  url: postgresql://db/x\n" + text)
    return path


def test_trusted_proxies_are_read_from_the_config(tmp_path):
    config = load_config(write(tmp_path, "api:\n  trusted_proxies: [10.0.0.0/8, '::1', 192.0.2.1/24]\n"),
                         environ={})
    assert config.api.trusted_proxies == ["10.0.0.0/8", "::1", "192.0.2.1/24"]
    assert [str(n) for n in networks(config.api.trusted_proxies)] == ["10.0.0.0/8", "::1/128", "192.0.2.0/24"]
    assert load_config(write(tmp_path, ""), environ={}).api.trusted_proxies == []
    from_env = load_config(write(tmp_path, ""),
                           environ={"WEBHOOK_WORKER_API__TRUSTED_PROXIES": '["10.0.0.1"]'})
    assert from_env.api.trusted_proxies == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[10.0.0.0/33]", 'api.trusted_proxies: "10.0.0.0/33" is not an address or a CIDR'),
        ("[proxy.internal]", 'api.trusted_proxies: "proxy.internal" is not an address or a CIDR'),
        ("10.0.0.0/8", "api.trusted_proxies: Input should be a valid list"),
    ],
)
def test_a_bad_trusted_proxy_names_the_key_and_the_problem(tmp_path, value, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, f"api:\n  trusted_proxies: {value}\n"), environ={})
    assert expected in str(caught.value)


def test_where_a_client_reached_the_api_is_believed_from_a_trusted_proxy_only():
    def origin(peer, proto=(), host=(), scheme="http", given="api.internal:8000"):
        return forwarded_origin(peer, PROXIES, scheme, given, list(proto), list(host))

    assert origin("203.0.113.5", ["https"], ["evil.example.com"]) is None  # anyone may send them
    assert origin(None, ["https"], ["evil.example.com"]) is None
    assert origin("10.1.2.3", ["https"], ["hooks.example.com"]) == "https://hooks.example.com"
    # the nearest proxy's value is the right-most
    assert origin("10.1.2.3", ["http, https"], ["a.example, hooks.example.com:8443"]) == \
        "https://hooks.example.com:8443"
    # without the headers: the scheme and Host it forwarded
    assert origin("10.1.2.3") == "http://api.internal:8000"
    assert origin("10.1.2.3", host=["[2001:db8::1]:443"], proto=["HTTPS"]) == "https://[2001:db8::1]:443"
    for proto, host in ((["ftp"], ["hooks.example.com"]), (["https"], ["hooks.example.com/x"]),
                        (["https"], ["user@hooks.example.com"]), (["https"], ["a b"])):
        assert origin("10.1.2.3", proto, host) is None, (proto, host)


@pytest.mark.parametrize("value, said", [
    ("webhooks.example.com", "expected http:// or https://"),
    ("https://webhooks.example.com/console", "only the scheme, host and port"),
    ("https://webhooks.example.com/?x=1", "only the scheme, host and port"),
    ("https://user:pw@webhooks.example.com", "must not carry credentials"),
    ("https://webhooks.example.com:99999", "not a valid URL"),
])
def test_the_public_url_is_an_origin(value, said):
    with pytest.raises(ConfigError, match=f"^api.public_url: {said}") as refused:
        load_config(None, {"DATABASE_URL": "postgresql://x/y", "WEBHOOK_WORKER_API__PUBLIC_URL": value})
    assert "pw" not in str(refused.value)  # a URL is never echoed: it may carry credentials


def test_a_public_url_is_kept_as_its_origin():
    config = load_config(None, {"DATABASE_URL": "postgresql://x/y",
                                "WEBHOOK_WORKER_API__PUBLIC_URL": "https://webhooks.example.com/"})
    assert config.api.public_url == "https://webhooks.example.com"
