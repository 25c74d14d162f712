"""Standard Webhooks signatures, checked against the specification's published test vector."""

import base64

import pytest

from worker.rules import signing

# From the Standard Webhooks specification (and Svix's documentation of the same scheme).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(signature: str, timestamp: int = VECTOR_TIMESTAMP) -> dict[str, str]:
    return {"webhook-id": VECTOR_ID, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


def test_sign_matches_the_published_vector():
    assert signing.sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY) == VECTOR_SIGNATURE


def test_verify_accepts_the_published_vector():
    signing.verify(VECTOR_SECRET, headers(VECTOR_SIGNATURE), VECTOR_BODY, now=VECTOR_TIMESTAMP + 10)


def test_verify_accepts_any_of_several_signatures():
    other = signing.sign(signing.generate_secret(), VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY)
    signing.verify(VECTOR_SECRET, headers(f"{other} {VECTOR_SIGNATURE}"), VECTOR_BODY,
                   now=VECTOR_TIMESTAMP)


@pytest.mark.parametrize("skew", [-301, 301])
def test_verify_rejects_timestamps_outside_five_minutes(skew):
    with pytest.raises(signing.VerificationError, match="tolerance"):
        signing.verify(VECTOR_SECRET, headers(VECTOR_SIGNATURE), VECTOR_BODY,
                       now=VECTOR_TIMESTAMP + skew)


def test_verify_rejects_a_changed_body():
    with pytest.raises(signing.VerificationError, match="no matching"):
        signing.verify(VECTOR_SECRET, headers(VECTOR_SIGNATURE), VECTOR_BODY + b" ",
                       now=VECTOR_TIMESTAMP)


def test_generated_secrets_are_whsec_with_at_least_24_random_bytes():
    secret = signing.generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) >= 24
    assert signing.generate_secret() != secret


def test_rotation_header_carries_one_signature_per_secret():
    second = signing.generate_secret()
    header = signing.signature_header([VECTOR_SECRET, second], VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY)
    parts = header.split(" ")
    assert parts[0] == VECTOR_SIGNATURE and len(parts) == 2


def _base64_of(length: int) -> str:
    return base64.b64encode(bytes(range(length))).decode()


# what the CLI and the API refuse, and why; sql/functions/endpoints.sql repeats the rule
REFUSED_SECRETS = [
    pytest.param("nope", "does not start with 'whsec_'", id="no-prefix"),
    pytest.param(_base64_of(32), "does not start with 'whsec_'", id="bare-base64"),
    pytest.param("whsec_AA==", "this one is 1 byte", id="1-byte"),
    pytest.param("whsec_" + _base64_of(23), "this one is 23 bytes", id="23-bytes"),
    pytest.param("whsec_" + _base64_of(65), "this one is 65 bytes", id="65-bytes"),
    pytest.param("whsec_", "this one is 0 bytes", id="empty"),
    pytest.param("whsec_" + _base64_of(32)[:-1], "not base64", id="unpadded"),
    pytest.param("whsec_" + _base64_of(32) + "\n", "not base64", id="newline"),
    pytest.param("whsec_" + "%" * 44, "not base64", id="not-base64"),
]
ACCEPTED_SECRETS = ["whsec_" + _base64_of(24), "whsec_" + _base64_of(64), VECTOR_SECRET]


@pytest.mark.parametrize(("secret", "reason"), REFUSED_SECRETS)
def test_a_signing_secret_that_is_not_whsec_and_24_to_64_bytes_of_base64_is_refused(secret, reason):
    problem = signing.secret_problem(secret)
    assert problem is not None and reason in problem
    assert problem.startswith("a signing secret is 'whsec_' followed by the base64 of 24 to 64 bytes")
    encoded = secret.removeprefix("whsec_").strip()
    assert len(encoded) < 3 or encoded not in problem  # never echoed


@pytest.mark.parametrize("secret", ACCEPTED_SECRETS)
def test_a_standard_webhooks_secret_of_24_to_64_bytes_is_accepted(secret):
    assert signing.secret_problem(secret) is None
    assert signing.secret_problem(signing.generate_secret()) is None


@pytest.mark.parametrize("skew", [-300, 300])
def test_verify_accepts_a_timestamp_exactly_at_the_tolerance(skew):
    signing.verify(VECTOR_SECRET, headers(VECTOR_SIGNATURE), VECTOR_BODY, now=VECTOR_TIMESTAMP + skew)


def test_verify_reads_the_clock_when_not_given_a_time():
    import time

    now = int(time.time())
    body = b'{"now": true}'
    signed = headers(signing.sign(VECTOR_SECRET, VECTOR_ID, now, body), timestamp=now)
    signing.verify(VECTOR_SECRET, signed, body)
    with pytest.raises(signing.VerificationError, match="tolerance"):
        signing.verify(VECTOR_SECRET, headers(VECTOR_SIGNATURE), VECTOR_BODY)  # 2021's vector


@pytest.mark.parametrize(("changes", "message"), [
    ({"webhook-id": None}, "missing header webhook-id"),
    ({"webhook-signature": None}, "missing header webhook-signature"),
    ({"webhook-timestamp": "soon"}, "webhook-timestamp is not an integer"),
    ({}, "webhook-timestamp is outside the tolerance"),
    ({"webhook-signature": "v1,AAAA"}, "no matching signature"),
])
def test_each_verification_failure_says_which(changes, message):
    given = {k: v for k, v in {**headers(VECTOR_SIGNATURE), **changes}.items() if v is not None}
    now = None if not changes else VECTOR_TIMESTAMP  # the vector's time is long past by the clock
    with pytest.raises(signing.VerificationError) as raised:
        signing.verify(VECTOR_SECRET, given, VECTOR_BODY, now=now)
    assert str(raised.value) == message

