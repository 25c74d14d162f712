"""The HTTP side against receivers that close kept-alive connections: no URL text in what
is stored or logged, and a request dropped with its reused connection is sent again, not failed."""

import json

from tests.faults import misbehaving
from tests.faults.misbehaving import TcpServer
from tests.receiver import Reply
from tests.support import add_endpoint, enqueue, query, statuses, wait_final

FAST_RETRY = {"delays": [0.1]}
LEAKS = ("SECRETPATH", "SECRETQUERY", "/services/T0")


def test_the_keepalive_race_costs_no_attempt_and_puts_no_url_into_error_columns_or_logs(db, spawn):
    # 200 with Content-Length and keep-alive, then a hang-up 60-110 ms later
    receiver = misbehaving.ClosesSoonAfterAnswering(0.06, 0.11)
    server = TcpServer(receiver).start()
    try:
        endpoint = add_endpoint(db, server.url("/services/T0/B0/SECRETPATH?token=SECRETQUERY"),
                                max_in_flight=1, retry_schedule=FAST_RETRY)
        ids = enqueue(db, endpoint, count=80)
        worker = spawn(db)
        wait_final(db, ids, message="every row final")
        assert set(statuses(db, ids).values()) == {"delivered"}
        queue_errors = query(db, "SELECT last_error, dead_letter_reason FROM webhooks.alert_delivery_queue")
        log_errors = query(db, "SELECT error FROM webhooks.alert_delivery_log")
        logs = worker.log_path.read_text()
        print(f"keep-alive race: {server.connections} connections, {receiver.dropped} requests met a"
              f" closing connection, {receiver.fresh_connection_requests} sent again on a fresh one,"
              f" {sum(1 for (e,) in log_errors if e)} failed attempts")
        # the race happened: requests went out on kept-alive connections the receiver was closing
        assert receiver.dropped > 0
        assert receiver.fresh_connection_requests >= receiver.dropped  # each sent again on a new one
        for text in (json.dumps(queue_errors), json.dumps(log_errors), logs):
            for leak in LEAKS:
                assert leak not in text
        # the requests that met a closing connection were sent again at once, not failed
        assert log_errors == [(None,)] * len(ids)
        assert worker.process.poll() is None
    finally:
        server.stop()


def test_a_request_dropped_with_its_reused_connection_is_sent_again_on_a_new_one(db, spawn):
    receiver = misbehaving.DropsReusedConnections()
    server = TcpServer(receiver).start()
    try:
        # one request at a time, so each delivery after the first goes out on a kept-alive connection
        endpoint = add_endpoint(db, server.url("/hook"), max_in_flight=1, retry_schedule=FAST_RETRY)
        ids = enqueue(db, endpoint, count=20)
        spawn(db)
        wait_final(db, ids, message="every row final")
        print(f"reused connections dropped under a request: {len(receiver.dropped)}")

        assert receiver.dropped, "no kept-alive connection was closed under a request"
        # no attempt failed because of it: each delivery took exactly one attempt, logged once
        assert set(statuses(db, ids).values()) == {"delivered"}
        assert query(db, "SELECT DISTINCT attempts FROM webhooks.alert_delivery_queue") == [(1,)]
        assert query(db, "SELECT outcome, attempt, count(*) FROM webhooks.alert_delivery_log GROUP BY 1, 2"
                     ) == [("delivered", 1, len(ids))]
        # each dropped request was sent again, as the same attempt, on another connection
        answered = {(delivery, attempt): connection for connection, delivery, attempt in receiver.answered}
        for connection, delivery, attempt in receiver.dropped:
            assert attempt == "1"
            assert answered[(delivery, attempt)] != connection
    finally:
        server.stop()


def test_a_receivers_cookie_is_never_sent_back_nor_to_another_endpoint_on_its_host(db, receiver, spawn):
    # by name, not IP literal: aiohttp's default jar keeps cookies of named hosts only
    setter = add_endpoint(db, receiver.url("/sets-cookie").replace("127.0.0.1", "localhost"))
    other = add_endpoint(db, receiver.url("/other").replace("127.0.0.1", "localhost"))
    receiver.script("/sets-cookie", Reply(headers={"Set-Cookie": "session=from-endpoint-a; Path=/"}))
    first = enqueue(db, setter)
    spawn(db)
    wait_final(db, first, message="the cookie-setting delivery done")
    later = enqueue(db, setter) + enqueue(db, other)
    wait_final(db, later, message="the later deliveries done")
    assert set(statuses(db, first + later).values()) == {"delivered"}
    requests = receiver.to("/sets-cookie") + receiver.to("/other")
    assert len(requests) == 3
    assert all("cookie" not in r.headers for r in requests)
