"""Which claimed rows go as one request, the digest's webhook-id, and the coalescing options."""

from dataclasses import dataclass

import pytest

from worker.rules.coalescing import digest_label, digest_webhook_id, requests, settings_changes


@dataclass(frozen=True)
class Row:
    delivery_id: int
    idempotency_key: str
    digest_id: int | None = None


def test_rows_become_requests_in_claim_order_a_digests_members_by_delivery_id():
    rows = [Row(5, "e5", 2), Row(1, "e1"), Row(3, "e3", 2), Row(4, "e4", 7), Row(2, "e2", 2)]
    assert [[r.delivery_id for r in request] for request in requests(rows)] == [[2, 3, 5], [1], [4]]


def test_a_digests_webhook_id_depends_on_its_members_only():
    same = digest_webhook_id([Row(1, "a", 9), Row(2, "b", 9)])
    assert same == digest_webhook_id([Row(2, "b", 4), Row(1, "a", 4)])  # order and digest id aside
    assert same != digest_webhook_id([Row(1, "a", 9)])  # a member left: a different message
    assert same.startswith("digest_") and len(same) == len("digest_") + 32
    assert digest_label(17) == "d-17"


def test_coalescing_options_become_update_fields_or_a_clear_error():
    assert settings_changes(50, None, "slack") == {"coalesce_max": 50}
    assert settings_changes(50, 2.5, "envelope") == {"coalesce_max": 50, "coalesce_window": "2.5 seconds"}
    assert settings_changes(None, 3, "slack", stored_max=20) == {"coalesce_window": "3 seconds"}
    assert settings_changes(0, None, "raw", stored_max=20) == {"coalesce_max": None, "coalesce_window": None}
    assert settings_changes(None, None, "slack") == {}


@pytest.mark.parametrize(("args", "message"), [
    ((1, None, "slack"), "--coalesce-max: must be between 2 and 1000"),
    ((5000, None, "slack"), "--coalesce-max: must be between 2 and 1000"),
    ((None, 5, "slack"), "--coalesce-window: needs --coalesce-max"),
    ((10, -1, "slack"), "--coalesce-window: must be between 0 and 3600"),
    ((10, None, "raw"), "--coalesce-max: format raw is never coalesced"),
    ((10, None, "pagerduty"), "--coalesce-max: format pagerduty is never coalesced"),
    ((0, 5, "slack"), "--coalesce-window: not with --coalesce-max 0"),
])
def test_a_bad_policy_names_the_option(args, message):
    with pytest.raises(ValueError, match=message):
        settings_changes(*args)


def test_changing_a_coalescing_endpoint_to_a_format_that_never_coalesces_is_refused():
    with pytest.raises(ValueError, match="--format raw: the endpoint coalesces"):
        settings_changes(None, None, "raw", stored_max=50)
    assert settings_changes(None, None, "raw", stored_max=None) == {}


def test_a_digests_webhook_id_is_stable_across_releases():
    # a receiver deduplicates a digest sent again by this id, possibly by a worker of a newer release
    members = [Row(2, "alert-2"), Row(1, "alert-1")]
    assert digest_webhook_id(members) == "digest_3acd2fc7913681cf0269a7358c458b18"


@pytest.mark.parametrize(("args", "fields"), [
    ((2, None, "slack"), {"coalesce_max": 2}),
    ((1000, None, "slack"), {"coalesce_max": 1000}),
    ((2, 0, "slack"), {"coalesce_max": 2, "coalesce_window": "0 seconds"}),
    ((2, 3600, "slack"), {"coalesce_max": 2, "coalesce_window": "3600 seconds"}),
])
def test_the_policy_bounds_are_inclusive(args, fields):
    assert settings_changes(*args) == fields


@pytest.mark.parametrize(("args", "message"), [
    ((1, None, "slack"), "--coalesce-max: must be between 2 and 1000 rows per request, not 1"),
    ((10, 3601, "slack"), "--coalesce-window: must be between 0 and 3600 seconds, not 3601"),
    ((None, 5, "slack"), "--coalesce-window: needs --coalesce-max (how many rows one request may carry)"),
    ((10, None, "raw"), "--coalesce-max: format raw is never coalesced (only slack, mattermost, envelope "
                        "bodies can carry several alerts)"),
    ((0, 5, "slack"), "--coalesce-window: not with --coalesce-max 0 (which turns coalescing off)"),
    ((None, None, "raw", 50), "--format raw: the endpoint coalesces, and raw bodies never are; turn "
                              "coalescing off first (--coalesce-max 0)"),
])
def test_each_policy_error_reads_in_full(args, message):
    with pytest.raises(ValueError) as raised:
        settings_changes(*args)
    assert str(raised.value) == message
