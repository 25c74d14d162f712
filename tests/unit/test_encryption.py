"""Credentials at rest: AES-256-GCM envelopes, purposes bound as associated data, keyrings and rotation."""

import base64
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker import encryption
from worker.encryption import DecryptionError, Keyring, KeyringError, load_keyring
from worker.errors import ConfigError

PURPOSES = [encryption.URL, encryption.SIGNING_SECRET, encryption.setting("api_token")]


def new_key() -> str:
    return encryption.generate_key()


def keyring(*keys: str) -> Keyring:
    return Keyring.parse(",".join(keys), "test")


def key_bytes(key: str) -> bytes:
    return base64.b64decode(key)


def flip(text: str, index: int) -> str:
    replacement = "A" if text[index] != "A" else "B"
    return text[:index] + replacement + text[index + 1 :]


def test_seal_then_open_returns_the_plaintext():
    ring = keyring(new_key())
    sealed = ring.seal("https://user:pw@hooks.example.com/x", encryption.URL)
    assert sealed.startswith(encryption.PREFIX)
    assert "hooks.example.com" not in sealed
    assert ring.open(sealed, encryption.URL) == "https://user:pw@hooks.example.com/x"


def test_envelope_names_the_primary_key_id():
    ring = keyring(new_key())
    sealed = ring.seal("x", encryption.URL)
    assert encryption.sealed_key_id(sealed) == ring.primary_id
    assert len(ring.primary_id) == 8


def test_every_seal_of_the_same_value_differs():
    ring = keyring(new_key())
    seals = {ring.seal("same value", encryption.SIGNING_SECRET) for _ in range(20)}
    assert len(seals) == 20
    assert all(ring.open(s, encryption.SIGNING_SECRET) == "same value" for s in seals)


def test_a_value_sealed_for_one_purpose_does_not_open_as_another():
    ring = keyring(new_key())
    sealed = ring.seal("whsec_abc", encryption.URL)
    with pytest.raises(DecryptionError, match="tampered or moved"):
        ring.open(sealed, encryption.SIGNING_SECRET)


def test_settings_are_bound_to_their_name():
    ring = keyring(new_key())
    sealed = ring.seal_settings({"token": "t0ken", "password": "pw"}, 7)
    assert ring.open_settings(sealed, 7) == {"token": "t0ken", "password": "pw"}
    with pytest.raises(DecryptionError):
        ring.open_settings({"password": sealed["token"]}, 7)


def test_a_value_bound_to_one_endpoint_does_not_open_on_another():
    ring = keyring(new_key())
    for purpose in (*PURPOSES, encryption.header("Authorization")):
        sealed = ring.seal("https://hooks.example.com/team-a", purpose, 41)
        assert ring.open(sealed, purpose, 41) == "https://hooks.example.com/team-a"
        for elsewhere in (42, 4, 411):
            with pytest.raises(DecryptionError, match="moved"):
                ring.open(sealed, purpose, elsewhere)
        with pytest.raises(DecryptionError):
            ring.open(sealed, purpose)  # nor as an unbound value


def test_headers_and_settings_are_bound_to_their_endpoint():
    ring = keyring(new_key())
    headers = ring.seal_headers({"Authorization": "Bearer t0ken"}, 3)
    settings = ring.seal_settings({"routing_key": "R0UTING"}, 3)
    assert ring.open_headers(headers, 3) == {"Authorization": "Bearer t0ken"}
    assert ring.open_settings(settings, 3) == {"routing_key": "R0UTING"}
    with pytest.raises(DecryptionError):
        ring.open_headers(headers, 4)
    with pytest.raises(DecryptionError):
        ring.open_settings(settings, 4)


def test_a_value_sealed_before_binding_still_opens_on_its_endpoint():
    ring = keyring(new_key())
    legacy = ring.seal("whsec_old", encryption.SIGNING_SECRET)  # the form written before binding
    assert ring.open(legacy, encryption.SIGNING_SECRET, 9) == "whsec_old"
    assert not ring.is_bound(legacy, encryption.SIGNING_SECRET, 9)
    with pytest.raises(DecryptionError):
        ring.open(legacy, encryption.URL, 9)  # still bound to its purpose


def test_a_plaintext_value_is_refused_unless_allowed_and_the_error_hides_it():
    ring = keyring(new_key())
    with pytest.raises(encryption.UnsealedValue) as excinfo:
        ring.open("https://hooks.example.com/secret-path", encryption.URL, 5)
    message = str(excinfo.value)
    assert "secret-path" not in message
    assert "url" in message and "keys rotate" in message and "require_sealed" in message
    with pytest.raises(encryption.UnsealedValue, match=r"headers\.authorization"):
        ring.open_headers({"Authorization": "Bearer x"}, 5)
    assert ring.open("https://hooks.example.com/x", encryption.URL, 5, allow_plaintext=True) == \
        "https://hooks.example.com/x"


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag"])
def test_a_tampered_envelope_does_not_open(where):
    ring = keyring(new_key())
    sealed = ring.seal("some secret value", encryption.URL)
    header_length = len(encryption.PREFIX) + len(ring.primary_id) + 1
    blob_length = len(sealed) - header_length
    # Positions well inside the base64, never the last character (whose low bits may be padding).
    index = header_length + {"nonce": 2, "ciphertext": 20, "tag": blob_length - 6}[where]
    tampered = flip(sealed, index)
    assert tampered != sealed
    with pytest.raises(DecryptionError, match=ring.primary_id):
        ring.open(tampered, encryption.URL)


def test_a_truncated_envelope_does_not_open():
    ring = keyring(new_key())
    sealed = ring.seal("some secret value", encryption.URL)
    for cut in (len(sealed) - 4, len(encryption.PREFIX) + len(ring.primary_id) + 5):
        with pytest.raises(DecryptionError):
            ring.open(sealed[:cut], encryption.URL)


def test_an_envelope_with_garbage_instead_of_base64_does_not_open():
    ring = keyring(new_key())
    with pytest.raises(DecryptionError):
        ring.open(f"{encryption.PREFIX}{ring.primary_id}:é€not-base64", encryption.URL)


def test_a_value_sealed_with_a_key_the_keyring_lacks_names_the_key_id():
    other = keyring(new_key())
    sealed = other.seal("secret", encryption.URL)
    ring = keyring(new_key())
    with pytest.raises(DecryptionError, match=other.primary_id) as excinfo:
        ring.open(sealed, encryption.URL)
    assert "does not hold" in str(excinfo.value)


@pytest.mark.parametrize(
    "plaintext", ["https://hooks.example.com/x", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "", "enc:v2:x"]
)
def test_open_returns_a_plaintext_value_unchanged_when_allowed(plaintext):
    ring = keyring(new_key())
    assert ring.open(plaintext, encryption.URL, allow_plaintext=True) == plaintext
    assert encryption.sealed_key_id(plaintext) is None


@pytest.mark.parametrize("separator", [",", " ", "\n", ", ", " ,\n\t", "\r\n"])
def test_keyring_parse_accepts_commas_spaces_and_lines(separator):
    first, second, third = new_key(), new_key(), new_key()
    ring = Keyring.parse(separator.join([first, second, third]), "test")
    expected = tuple(encryption.key_id(key_bytes(k)) for k in (first, second, third))
    assert ring.key_ids == expected


def test_keyring_parse_ignores_comments_and_blank_lines():
    first, second = new_key(), new_key()
    text = f"# keys for production\n\n{first}  # current, added 2024-05\n# {new_key()} retired\n{second}\n"
    ring = Keyring.parse(text, "test")
    assert ring.key_ids == (encryption.key_id(key_bytes(first)), encryption.key_id(key_bytes(second)))


def test_the_first_key_seals_and_every_key_opens():
    old, new = new_key(), new_key()
    old_ring = keyring(old)
    sealed_by_old = old_ring.seal("value", encryption.URL)
    ring = keyring(new, old)
    assert ring.primary_id == encryption.key_id(key_bytes(new))
    assert encryption.sealed_key_id(ring.seal("value", encryption.URL)) == ring.primary_id
    assert ring.open(sealed_by_old, encryption.URL) == "value"


def test_generated_keys_are_32_random_bytes_in_base64():
    key = new_key()
    assert len(key_bytes(key)) == encryption.KEY_BYTES
    assert new_key() != key


BAD_TOKENS = [
    pytest.param("not*base64*at*all!!", "not base64", id="not-base64"),
    pytest.param(base64.b64encode(b"sixteen-byte-key").decode(), "16 bytes", id="too-short"),
    pytest.param(base64.b64encode(os.urandom(33)).decode(), "33 bytes", id="too-long"),
    pytest.param(base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode(), "not base64", id="urlsafe-alphabet"),
]


@pytest.mark.parametrize(("token", "reason"), BAD_TOKENS)
def test_keyring_parse_errors_never_contain_the_key_text(token, reason):
    good = new_key()
    with pytest.raises(KeyringError) as excinfo:
        Keyring.parse(f"{good}\n{token}", "keys.txt")
    message = str(excinfo.value)
    assert reason in message
    assert "keys.txt: key 2" in message
    assert token not in message
    assert good not in message
    assert "\n" not in message


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "# only a comment\n", " , , "])
def test_keyring_parse_of_no_keys_is_an_error(text):
    with pytest.raises(KeyringError, match="no key found"):
        Keyring.parse(text, "keys.txt")


def test_a_keyring_needs_at_least_one_key():
    with pytest.raises(KeyringError):
        Keyring([])


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_", min_size=12))
@settings(max_examples=200, deadline=None)
def test_keyring_parse_never_echoes_a_bad_key(token):
    try:
        Keyring.parse(token, "src")
    except KeyringError as exc:
        assert token not in str(exc)


def test_reseal_moves_a_value_to_the_new_primary():
    old, new = new_key(), new_key()
    sealed = keyring(old).seal("whsec_x", encryption.SIGNING_SECRET, 3)
    ring = keyring(new, old)
    resealed = ring.reseal(sealed, encryption.SIGNING_SECRET, 3)
    assert encryption.sealed_key_id(resealed) == ring.primary_id
    assert keyring(new).open(resealed, encryption.SIGNING_SECRET, 3) == "whsec_x"


def test_reseal_leaves_a_bound_value_under_the_primary_unchanged():
    ring = keyring(new_key(), new_key())
    sealed = ring.seal("whsec_x", encryption.SIGNING_SECRET, 3)
    assert ring.reseal(sealed, encryption.SIGNING_SECRET, 3) is sealed


def test_reseal_binds_a_value_sealed_before_binding_to_its_endpoint():
    ring = keyring(new_key())
    legacy = ring.seal("whsec_x", encryption.SIGNING_SECRET)
    resealed = ring.reseal(legacy, encryption.SIGNING_SECRET, 3)
    assert resealed != legacy
    assert ring.is_bound(resealed, encryption.SIGNING_SECRET, 3)
    with pytest.raises(DecryptionError):
        ring.open(resealed, encryption.SIGNING_SECRET, 4)


def test_reseal_seals_a_plaintext_value_bound_to_its_endpoint():
    ring = keyring(new_key())
    resealed = ring.reseal("https://example.com/hook", encryption.URL, 3)
    assert encryption.sealed_key_id(resealed) == ring.primary_id
    assert ring.open(resealed, encryption.URL, 3) == "https://example.com/hook"
    assert ring.is_bound(resealed, encryption.URL, 3)


def test_load_keyring_prefers_the_environment_over_the_file(tmp_path):
    env_key, file_key = new_key(), new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(file_key + "\n")
    ring = load_keyring(str(keys_file), {encryption.KEYS_ENV: env_key})
    assert ring.key_ids == (encryption.key_id(key_bytes(env_key)),)


def test_load_keyring_reads_the_file_when_the_environment_is_empty(tmp_path):
    first, second = new_key(), new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# mounted Secret\n{first}\n{second}\n")
    for environ in ({}, {encryption.KEYS_ENV: "  \n"}):
        ring = load_keyring(str(keys_file), environ)
        assert ring.primary_id == encryption.key_id(key_bytes(first))
        assert len(ring.key_ids) == 2


def test_load_keyring_without_env_or_file_names_the_variable():
    with pytest.raises(KeyringError, match=encryption.KEYS_ENV):
        load_keyring(None, {})


def test_load_keyring_of_an_unreadable_file_names_the_setting(tmp_path):
    missing = tmp_path / "no-such-file"
    with pytest.raises(KeyringError, match=r"security\.encryption_keys_file") as excinfo:
        load_keyring(str(missing), {})
    assert "\n" not in str(excinfo.value)


def test_load_keyring_of_a_bad_file_names_the_setting_but_not_the_key(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("c2hvcnQta2V5LXRleHQ=\n")
    with pytest.raises(KeyringError, match=r"security\.encryption_keys_file") as excinfo:
        load_keyring(str(keys_file), {})
    assert "c2hvcnQta2V5LXRleHQ=" not in str(excinfo.value)


def test_load_keyring_of_a_bad_environment_names_the_variable():
    with pytest.raises(KeyringError, match=encryption.KEYS_ENV) as excinfo:
        load_keyring(None, {encryption.KEYS_ENV: "bm90LWEta2V5"})
    assert "bm90LWEta2V5" not in str(excinfo.value)


def test_a_keyring_error_is_a_config_error():
    assert issubclass(KeyringError, ConfigError)
    with pytest.raises(ConfigError):
        load_keyring(None, {})


SHARED_RING = keyring(new_key(), new_key())


@given(st.text(), st.sampled_from(PURPOSES) | st.text(max_size=20))
@settings(max_examples=200, deadline=None)
def test_open_of_seal_is_the_identity(plaintext, purpose):
    sealed = SHARED_RING.seal(plaintext, purpose)
    assert encryption.is_sealed(sealed)
    assert SHARED_RING.open(sealed, purpose) == plaintext


def test_a_keys_file_of_raw_bytes_is_a_keyring_error(tmp_path):
    # `openssl rand 32 > keys` (without -base64) is an easy mistake; it must give the one-line error.
    keys_file = tmp_path / "keys"
    keys_file.write_bytes(b"\xff\xfe" + bytes(range(128, 158)))
    with pytest.raises(KeyringError, match=r"security\.encryption_keys_file"):
        load_keyring(str(keys_file), {})


def test_the_keyring_keeps_no_opened_value():
    # An opened URL or secret lives only as long as the row that needs it: the keyring remembers
    # nothing it opened (the worker opens each endpoint's values once per claimed batch).
    keyring = Keyring.parse(encryption.generate_key(), "test")
    sealed = keyring.seal("https://x.test/hook/tok3n", encryption.URL, 5)
    assert keyring.open(sealed, encryption.URL, 5) == "https://x.test/hook/tok3n"
    assert not hasattr(Keyring._open, "cache_info")


def test_key_ids_and_url_fingerprints_are_stable_across_releases():
    # stored envelopes name their key by this id, and stored URL fingerprints are compared with new
    # ones: a change of derivation would orphan both
    assert encryption.key_id(bytes(32)) == "49ad0599"
    ring = Keyring([bytes(32), bytes([1]) * 32])
    assert ring.fingerprint("https://x.test/a") == "e42e269b"
    assert ring.fingerprint("https://x.test/b") != ring.fingerprint("https://x.test/a")
    # derived from the primary key only
    assert Keyring([bytes([1]) * 32]).fingerprint("https://x.test/a") != "e42e269b"


def test_missing_names_the_key_ids_in_use_the_keyring_lacks_in_order():
    ring = Keyring([bytes(32)])
    assert ring.missing(["plaintext", "ffff0000", "49ad0599", "0000ffff"]) == ["0000ffff", "ffff0000"]
    assert ring.missing(["plaintext", "49ad0599"]) == []


def test_settings_and_headers_open_plaintext_only_when_allowed():
    ring = Keyring([bytes(32)])
    assert ring.open_settings({"token": "plain"}, 1, allow_plaintext=True) == {"token": "plain"}
    assert ring.open_headers({"X-Key": "plain"}, 1, allow_plaintext=True) == {"X-Key": "plain"}
    with pytest.raises(encryption.UnsealedValue):
        ring.open_settings({"token": "plain"}, 1)
    with pytest.raises(encryption.UnsealedValue):
        ring.open_headers({"X-Key": "plain"}, 1)


def test_keyring_errors_say_what_is_wrong_in_their_own_words():
    with pytest.raises(KeyringError) as raised:
        Keyring([])
    assert str(raised.value) == "no encryption key"
    with pytest.raises(KeyringError) as raised:
        Keyring.parse(base64.b64encode(bytes(16)).decode(), "test")
    assert str(raised.value) == ("test: key 1 is 16 bytes; a key is 32 random bytes in base64 "
                                 "(`webhook-worker keys generate`)")
    sealed = Keyring([bytes(32)]).seal("x", "url")
    with pytest.raises(DecryptionError) as raised:
        Keyring([bytes(32)]).open(sealed, "signing_secret")
    assert str(raised.value) == ("a value sealed with key 49ad0599 does not open (tampered or moved from "
                                 "another field or endpoint)")
    with pytest.raises(encryption.UnsealedValue) as raised:
        Keyring([bytes(32)]).open("plain", "url")
    assert str(raised.value) == ("url is stored unsealed and security.require_sealed refuses plaintext; "
                                 "run `webhook-worker keys rotate` to seal it")


def test_load_keyring_errors_say_how_to_make_a_key(tmp_path):
    with pytest.raises(KeyringError) as raised:
        load_keyring(None, {})
    assert str(raised.value).endswith("(make one with `webhook-worker keys generate`)")
    raw = tmp_path / "keys"
    raw.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(KeyringError) as raised:
        load_keyring(str(raw), {})
    assert str(raised.value).endswith("is not text; keys are base64 (`openssl rand -base64 32`)")
