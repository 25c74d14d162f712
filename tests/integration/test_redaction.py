"""Receivers that echo the URL they were sent to: what the audit log and the queue keep of their
answers, and of error texts, holds no secret part of the URL (worker/rules/redaction.py)."""

import base64
import json
import ssl

import trustme

from tests.integration.test_coalescing import coalesce
from tests.receiver import Receiver, Reply
from tests.support import add_endpoint, enqueue, query, wait_final

# The path's token, a query value and the password; each is in the URL in a spelling that yarl
# (what aiohttp sends) changes: %2B stays, %41 becomes A, %40 is the password's @.
PATH = "/services/T0FAKETEAM/B0FAKEBOT/SECRETPATH%2Bt%41il"
QUERY = "token=SECRETQUERY&channel=ops"
USERINFO = "hook-user:SECRETPASS%40word"
SECRETS = ("SECRETPATH", "SECRETQUERY", "SECRETPASS", "T0FAKETEAM", "B0FAKEBOT",
           base64.b64encode(b"hook-user:SECRETPASS@word").decode())
# An Express 404 page, quoting the request's target as received, then decoded, and the request's
# Authorization header, as a debugging receiver (httpbin and the like) does.
EXPRESS_404 = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>Error</title>\n'
               "</head>\n<body>\n<pre>Cannot POST {url}</pre>\n<p>decoded: {decoded}</p>\n"
               "<p>Authorization: {authorization}</p>\n</body>\n</html>\n")


def secret_url(receiver: Receiver) -> str:
    return receiver.url(f"{PATH}?{QUERY}").replace("://", f"://{USERINFO}@")


def stored_texts(db: str, ids: list[int]) -> str:
    """Every text a reader can see of these deliveries: the queue's and the audit log's."""
    return json.dumps(query(db, "SELECT q.last_error, q.dead_letter_reason, l.error, l.response_excerpt"
                                " FROM webhooks.alert_delivery_queue q"
                                " JOIN webhooks.alert_delivery_log l USING (delivery_id)"
                                " WHERE delivery_id = ANY(%s)", (ids,)))


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret.lower() in text.lower()]


def excerpts(db: str, ids: list[int]) -> list[str]:
    return [e for (e,) in query(db, "SELECT response_excerpt FROM webhooks.alert_delivery_log"
                                    " WHERE delivery_id = ANY(%s) ORDER BY delivery_id", (ids,))]


def test_an_answer_echoing_the_url_is_stored_without_its_secret_parts_and_with_the_rest(db, receiver, spawn):
    not_found = add_endpoint(db, secret_url(receiver), max_attempts=1)
    moved = add_endpoint(db, secret_url(receiver), max_attempts=1)
    echoing = add_endpoint(db, secret_url(receiver), max_attempts=1)
    [lost] = enqueue(db, not_found)
    [redirected] = enqueue(db, moved)
    [delivered] = enqueue(db, echoing)
    receiver.script_delivery(lost, Reply(404, echo_url=EXPRESS_404))
    receiver.script_delivery(redirected, Reply(
        302, headers={"Location": receiver.url(f"{PATH}/?{QUERY}")},
        echo_url=f"Found. Redirecting to {receiver.url('')}{{url}}/"))
    receiver.script_delivery(delivered, Reply(200, echo_url='{"url": "{url}", "auth": "{authorization}"}'))
    ids = [lost, redirected, delivered]
    worker = spawn(db)
    wait_final(db, ids, message="all final")

    # the receiver did get (and so could echo) every secret part
    assert {r.delivery_id for r in receiver.requests} == set(ids)
    for request in receiver.requests:
        assert "SECRETPATH+tAil" in request.path and request.headers["authorization"].endswith(SECRETS[-1])
    assert query(db, "SELECT delivery_id, status, failure_category FROM webhooks.alert_delivery_queue"
                     " ORDER BY delivery_id") == [(lost, "dead_letter", "http_4xx"),
                                                  (redirected, "dead_letter", "redirect"),
                                                  (delivered, "delivered", None)]
    assert leaks(stored_texts(db, ids)) == []
    assert leaks(worker.log_path.read_text()) == []
    # what is not secret stays, so the excerpt still says what went wrong
    page, redirect, echoed = excerpts(db, ids)
    assert "<title>Error</title>" in page and "<pre>Cannot POST [redacted]</pre>" in page
    assert "<p>decoded: [redacted]</p>" in page and "<p>Authorization: Basic [redacted]</p>" in page
    assert redirect == f"Found. Redirecting to {receiver.url('')}[redacted]/"
    assert json.loads(echoed) == {"url": "[redacted]", "auth": "Basic [redacted]"}


def test_a_digest_s_echoed_url_is_stored_without_its_secret_parts_for_every_member(db, receiver, spawn):
    # rows held by the rate limit go as one request: the second way outcomes are made
    endpoint = add_endpoint(db, secret_url(receiver), body_format="envelope", rate_limit_per_second=5,
                            rate_limit_burst=1, max_attempts=1)
    coalesce(db, endpoint, 10)
    receiver.script(PATH.replace("%2B", "+").replace("%41", "A"), Reply(404, echo_url=EXPRESS_404))
    ids = enqueue(db, endpoint, {"title": "link down"}, count=4)
    spawn(db)
    wait_final(db, ids, message="4 dead-lettered")

    [request] = receiver.requests
    assert "webhook-digest-id" in request.headers and "SECRETPATH" in request.path
    assert leaks(stored_texts(db, ids)) == []
    stored = excerpts(db, ids)
    assert len(stored) == 4 and len(set(stored)) == 1
    assert "<title>Error</title>" in stored[0] and "<pre>Cannot POST [redacted]</pre>" in stored[0]


def test_failed_connections_store_no_secret_part_of_the_url_in_their_error(db, receiver, spawn):
    # TLS with a certificate no configured CA signed, and a port nobody listens on: aiohttp's
    # messages for both may quote the URL; the stored error never does
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)
    untrusted = Receiver(tls=context).start()
    try:
        tls = add_endpoint(db, secret_url(untrusted), max_attempts=1)
        refused = add_endpoint(db, f"http://{USERINFO}@127.0.0.1:1{PATH}?{QUERY}", max_attempts=1)
        ids = [enqueue(db, e)[0] for e in (tls, refused)]
        worker = spawn(db)
        wait_final(db, ids, message="both dead-lettered")
    finally:
        untrusted.stop()
    assert query(db, "SELECT failure_category FROM webhooks.alert_delivery_queue ORDER BY delivery_id"
                 ) == [("tls",), ("connect",)]
    stored = stored_texts(db, ids)
    assert leaks(stored) == [] and leaks(worker.log_path.read_text()) == []
    assert "TLS error" in stored and "connection failed" in stored
