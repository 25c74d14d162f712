"""The endpoint commands' pure decisions: the allow_networks hint and the routing-key rule."""

import ipaddress
import re

import pytest

from worker.cli.base import UsageError
from worker.cli.endpoints import _check_routing_key, allow_networks_hint


def test_the_hint_names_the_cidr_to_allow_and_where_it_goes():
    hint = allow_networks_hint("destination 127.0.0.1 is not a public address",
                               ipaddress.ip_address("127.0.0.1"))
    assert "127.0.0.1/32 under security.allow_networks" in hint and "--config" in hint
    assert "fd00::1/128" in allow_networks_hint("destination fd00::1 is not a public address",
                                                ipaddress.ip_address("fd00::1"))
    assert "a CIDR" in allow_networks_hint("destination x is not a public address", None)


def test_no_hint_where_allowing_a_network_would_not_help():
    assert allow_networks_hint("scheme 'ftp' is not allowed: only http and https", None) == ""
    assert allow_networks_hint("https is required (security.require_https)",
                               ipaddress.ip_address("10.0.0.1")) == ""


@pytest.mark.parametrize(("args", "expected"), [
    (("raw", "R"), "only with --format pagerduty (the format is raw)"),
    ((None, "R", "slack"), "the format is slack"),
    (("pagerduty", None), "required with --format pagerduty"),
    (("pagerduty", " "), "must not be empty"),
    (("slack", "R", "pagerduty"), "the format is slack"),
])
def test_a_routing_key_goes_with_the_pagerduty_format_only(args, expected):
    with pytest.raises(UsageError, match=re.escape(expected)):
        _check_routing_key(*args)


@pytest.mark.parametrize("args", [
    ("pagerduty", "R"), (None, "R", "pagerduty"), ("pagerduty", None, "raw", True), ("raw", None),
    (None, None, "pagerduty"),
])
def test_accepted_routing_key_combinations(args):
    _check_routing_key(*args)
