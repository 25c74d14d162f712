"""The rules for an endpoint's custom headers (reserved names, HTTP tokens, values, URL credentials)
and its URL's length."""

import pytest

from worker.rules.destinations import DestinationRules
from worker.rules.registration import (
    MAX_URL_CHARS,
    PRODUCT_HEADERS,
    TOKEN_CHARS,
    VALUE_CHARS,
    endpoint_name_problem,
    header_problem,
    headers_problem,
    is_reserved,
    registration_url_problem,
    sendable_headers,
    url_has_userinfo,
)

FRAMING = ["Transfer-Encoding", "transfer-encoding", "Connection", "Keep-Alive", "TE", "Trailer",
           "Upgrade", "Host", "Content-Length", "Proxy-Authorization", "Proxy-Connection", "proxy-anything"]


@pytest.mark.parametrize("name", FRAMING)
def test_framing_hop_by_hop_and_proxy_headers_are_reserved(name):
    assert is_reserved(name)
    problem = header_problem(name, "chunked")
    assert problem is not None and name in problem and "chunked" not in problem


def test_every_header_the_sender_sets_is_reserved_here_too():
    assert all(is_reserved(name) for name in PRODUCT_HEADERS)
    assert "overridden" in (header_problem("webhook-signature", "v1,forged") or "")


@pytest.mark.parametrize("name", ["X-A B", "X-Naïve", "X:A", "X(A)", "X\tA", "X-A\r\nX-B", "", "X/A",
                                  "x" * 257])
def test_a_name_that_is_not_an_http_token_is_refused_without_echoing_it(name):
    problem = header_problem(name, "v")
    assert problem is not None
    assert "token" in problem or "empty" in problem
    if name:
        assert name not in problem


@pytest.mark.parametrize("name", ["X-Team", "Authorization", "x-api-key", "X_Odd.Name!#$%&'*+^`|~1"])
def test_token_names_are_accepted(name):
    assert header_problem(name, "Bearer abc def") is None


@pytest.mark.parametrize(("value", "expected"), [
    ("a\r\nInjected: 1", "control characters"),
    ("a\nb", "control characters"),
    ("nul\x00", "control characters"),
    ("del\x7f", "control characters"),
    ("café", "ASCII"),
    (" padded", "start or end"),
    ("padded\t", "start or end"),
    ("x" * 8193, "longer than"),
])
def test_a_bad_value_is_refused_naming_the_header_but_not_the_value(value, expected):
    problem = header_problem("X-Token", value)
    assert problem is not None and expected in problem and "X-Token" in problem
    assert value.strip() not in problem


def test_tabs_spaces_and_empty_values_are_accepted():
    assert header_problem("X-A", "a\tb c") is None
    assert header_problem("X-A", "") is None


def test_url_credentials_and_an_authorization_header_are_refused_together():
    problem = headers_problem("https://user:pw@hooks.example.com/x", {"authorization": "Bearer t"})
    assert problem is not None and "Authorization" in problem and "pw" not in problem
    assert headers_problem("https://user@hooks.example.com/x", {"Authorization": "Bearer t"}) is not None
    assert headers_problem("https://hooks.example.com/x", {"Authorization": "Bearer t"}) is None
    assert headers_problem("https://user:pw@hooks.example.com/x", {"X-Team": "ops"}) is None


def test_a_name_given_twice_in_different_case_is_refused():
    assert "twice" in (headers_problem("https://h.example/x", {"X-A": "1", "x-a": "2"}) or "")


def test_headers_problem_reports_the_first_bad_header():
    problem = headers_problem("https://h.example/x", {"X-Good": "1", "Transfer-Encoding": "chunked"})
    assert problem is not None and "Transfer-Encoding" in problem


# --- the URL's length: README's 2,048 characters, for the CLI and the API alike ----------

HOOK = "https://hooks.example.com/"


def test_a_url_of_2048_characters_is_registered_and_one_more_is_refused_without_echoing_it():
    longest = HOOK + "p" * (MAX_URL_CHARS - len(HOOK))
    assert len(longest) == 2048 and registration_url_problem(longest, DestinationRules()) is None
    too_long = HOOK + "SECRETPATH" + "p" * 3000
    problem = registration_url_problem(too_long, DestinationRules())
    assert problem == f"URL longer than 2,048 characters (it has {len(too_long):,})"
    assert "SECRETPATH" not in problem
    # counted in characters, as README states it, not in bytes
    assert registration_url_problem(HOOK + "é" * (MAX_URL_CHARS - len(HOOK)), DestinationRules()) is None


def test_the_length_is_checked_before_the_destination_rules():
    policy = DestinationRules()
    assert "scheme" in (registration_url_problem("ftp://example.com/x", policy) or "")
    assert "longer than" in (registration_url_problem("ftp://example.com/" + "x" * 3000, policy) or "")


# --- the edges of each rule (mutants showed them untested) -------------------------------------


@pytest.mark.parametrize(("name", "problem"), [
    ("payments", None),
    ("Zahlungen – EU", None),
    ("x" * 200, None),
    ("x" * 201, "at most 200 characters"),
    ("  ", "must not be empty"),
    ("a\tb", "must be printable"),
    ("1234", "must not be all digits (an all-digit ENDPOINT always means an id)"),
    ("١٢٣", None),  # Arabic-Indic digits are not an id
    ("v2", None),
])
def test_an_endpoint_name_is_checked_in_full(name, problem):
    assert endpoint_name_problem(name) == problem


def test_header_limits_are_inclusive():
    every_token_char = "".join(sorted(TOKEN_CHARS))
    assert header_problem(every_token_char, "v") is None
    assert header_problem("x" * 256, "v") is None
    assert header_problem("X-Big", "v" * 8192) is None
    every_value_char = "!" + "".join(sorted(VALUE_CHARS)) + "!"
    assert header_problem("X-All", every_value_char) is None
    assert header_problem("X-Key", "XkeyX") is None  # only spaces and tabs count as padding
    assert headers_problem("https://x.test/", {f"X-H{i}": "v" for i in range(50)}) is None
    too_many = {f"X-H{i}": "v" for i in range(51)}
    assert headers_problem("https://x.test/", too_many) == "at most 50 custom headers"


def test_header_errors_read_in_full():
    assert header_problem("", "v") == "a header name must not be empty"
    assert header_problem("X Key", "v") == ("a header name must be an HTTP token (RFC 9110): ASCII letters, "
                                            "digits and !#$%&'*+-.^_`|~, without spaces")
    assert headers_problem("https://u:p@x.test/", {"Authorization": "Basic x"}) == (
        "Authorization: the URL carries credentials (user:password@host) as well; give them in one "
        "place only")


def test_only_the_headers_the_rules_allow_are_sent():
    stored = {"X-Key": "k", "Transfer-Encoding": "chunked", "Bad Name": "v", "X-Ctl": "a\nb"}
    assert sendable_headers(stored) == {"X-Key": "k"}


def test_a_url_that_does_not_parse_carries_no_credentials():
    assert url_has_userinfo("http://[::1/") is False
    assert url_has_userinfo("https://user@x.test/") is True
    assert url_has_userinfo("https://x.test/") is False
