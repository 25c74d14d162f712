"""Networks belong to whom the operator gives them: a worker delivers a tenant's endpoint to public
destinations and the networks granted to its tenant, never to the operator's security.allow_networks,
checked at every connection."""

from __future__ import annotations

import json

from tests.support import add_endpoint, enqueue, eventually, query, statuses, wait_final


def grant(db: str, tenant: str, *networks: str) -> None:
    query(db, "SELECT webhooks.update_tenant(%s, %s)",
          (tenant, json.dumps({"allow_networks": list(networks)})))


def outcome(db: str, delivery: int) -> tuple[str, str | None, str | None]:
    [row] = query(db, "SELECT status, failure_category, dead_letter_reason FROM webhooks.alert_delivery_queue"
                      " WHERE delivery_id = %s", (delivery,))
    return row


def test_a_worker_connects_a_tenants_endpoint_only_to_networks_granted_to_its_tenant(db, receiver, spawn):
    """The workers' allow list is loopback (the operator's receivers are there): the default tenant's
    endpoint delivers to the receiver on 127.0.0.1, and globex's endpoint to the same receiver, by a
    name that resolves there now (it may have resolved to a public address when it was registered),
    is refused at connect time, on the worker's own connection to that address, until the operator
    grants globex the network; a grant taken back holds from the next claim."""
    query(db, "SELECT webhooks.register_tenant('globex')")
    ours = add_endpoint(db, receiver.url("/ours"), name="ours")
    theirs = add_endpoint(db, f"http://localhost:{receiver.port}/theirs", name="theirs", tenant="globex")
    spawn(db)
    [first] = enqueue(db, ours)
    wait_final(db, [first], message="the operator's endpoint delivered")
    assert statuses(db, [first]) == {first: "delivered"}

    # a keep-alive connection to the receiver is open now, for the operator's endpoint: not globex's
    [refused] = enqueue(db, theirs)
    wait_final(db, [refused], message="globex's row refused")
    status, category, reason = outcome(db, refused)
    assert (status, category) == ("dead_letter", "blocked"), reason
    assert reason is not None and "not allowed for this tenant" in reason
    assert "allow_networks" not in reason and "config" not in reason  # nothing of the operator's
    assert [r.path for r in receiver.requests] == ["/ours"]

    grant(db, "globex", "127.0.0.1/32")
    query(db, "SELECT webhooks.replay(%s)", (refused,))
    eventually(lambda: statuses(db, [refused]) == {refused: "delivered"},
               message="globex's row delivered once its network is granted")
    assert [r.path for r in receiver.requests] == ["/ours", "/theirs"]

    grant(db, "globex")  # taken back
    [again] = enqueue(db, theirs)
    wait_final(db, [again], message="globex's row refused again")
    assert outcome(db, again)[:2] == ("dead_letter", "blocked")
    assert [r.path for r in receiver.requests] == ["/ours", "/theirs"]


def test_an_ip_literal_of_a_tenant_is_refused_before_any_connection(db, receiver, spawn):
    """The same rule for a URL naming the address itself: the fleet's list does not reach the tenant."""
    query(db, "SELECT webhooks.register_tenant('globex')")
    theirs = add_endpoint(db, receiver.url("/theirs"), name="theirs", tenant="globex")
    [delivery] = enqueue(db, theirs)
    spawn(db)
    wait_final(db, [delivery], message="refused")
    status, category, reason = outcome(db, delivery)
    assert (status, category) == ("dead_letter", "blocked")
    assert reason == ("destination 127.0.0.1 is not allowed for this tenant: not a public address, nor in "
                      "a network granted to the tenant")
    assert receiver.requests == []
