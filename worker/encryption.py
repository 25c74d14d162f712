"""Credentials at rest: AES-256-GCM envelopes under a keyring, so the database only holds ciphertext.

An envelope is `enc:v1:<key id>:<base64url(nonce || ciphertext || tag)>`. The key id is derived from
the key itself, so a worker tells at once whether it holds the key a value was sealed with. Each
value is bound to what it is (its "purpose": the URL, a signing secret, a named setting) as the
associated data together with the id of the endpoint it belongs to, so ciphertext copied from one
column, or one endpoint's row, to another does not decrypt. The first key of a keyring seals; every
key opens, which is what lets a fleet switch keys while it keeps running.

Values sealed before they were bound to their endpoint (the purpose alone as associated data) still
open, and `webhook-worker keys rotate` re-seals them bound. A value stored in plaintext opens only
where the caller allows it (security.require_sealed: false).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from worker.errors import ConfigError

PREFIX = "enc:v1:"
KEY_BYTES = 32
# webhooks.signing_secret_problem() (sql/functions/endpoints.sql) reads a sealed secret's length as
# its envelope's bytes less this nonce and GCM's 16-byte tag: change the envelope, change it too.
NONCE_BYTES = 12
KEYS_ENV = "WEBHOOK_WORKER_ENCRYPTION_KEYS"
URL = "url"
SIGNING_SECRET = "signing_secret"
FINGERPRINT_CHARS = 8


def setting(name: str) -> str:
    """The purpose of a named credential in an endpoint's secret_settings."""
    return f"secret_settings.{name}"


def header(name: str) -> str:
    """The purpose of a custom header's value (an Authorization header is a credential too)."""
    return f"headers.{name.lower()}"


class KeyringError(ConfigError):
    """A keyring problem, worded as one line that never contains key material."""


class DecryptionError(Exception):
    """A stored value cannot be opened with this keyring (unknown key, or tampered)."""


class UnsealedValue(DecryptionError):
    """A stored value is plaintext where only sealed values are accepted."""


def bound(purpose: str, endpoint_id: int) -> str:
    """The associated data of a value that belongs to one endpoint. Purposes never contain NUL
    (PostgreSQL's jsonb cannot store it; header names are tokens), so no purpose of an unbound value
    can equal a bound one."""
    return f"endpoint\x00{endpoint_id}\x00{purpose}"


def generate_key() -> str:
    """A new key: 32 random bytes, base64 (the same form as `openssl rand -base64 32`)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def key_id(key: bytes) -> str:
    """Eight hex digits naming a key; a hash of it, so the id reveals nothing usable."""
    return hashlib.sha256(b"webhook-worker key id\x00" + key).hexdigest()[:8]


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def sealed_key_id(value: str) -> str | None:
    """The key id of an envelope, or None for a value stored in plaintext."""
    if not is_sealed(value):
        return None
    return value[len(PREFIX) :].partition(":")[0]


class Keyring:
    """Keys in order of preference: the first seals new values, all of them open stored ones."""

    def __init__(self, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        self._keys = {key_id(k): AESGCM(k) for k in keys}
        if not self._keys:
            raise KeyringError("no encryption key")
        self.primary_id = next(iter(self._keys))
        self._fingerprint_key = hashlib.sha256(b"webhook-worker url fingerprint\x00" + keys[0]).digest()

    def fingerprint(self, text: str) -> str:
        """Eight hex digits that tell two URLs apart without revealing either: an HMAC under a key
        derived from the primary key, so without the key no guess at a path can be checked against
        it (a plain hash of a short path could be found by trying candidates)."""
        return hmac.new(self._fingerprint_key, text.encode(), hashlib.sha256).hexdigest()[:FINGERPRINT_CHARS]

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def missing(self, key_ids_in_use: Iterable[str]) -> list[str]:
        """The key ids in use (as webhooks.credential_keys() reports them) this keyring lacks."""
        return sorted(k for k in key_ids_in_use if k != "plaintext" and k not in self._keys)

    @classmethod
    def parse(cls, text: str, source: str) -> Keyring:
        """Keys separated by commas, spaces or lines (`#` starts a comment); the first is primary."""
        keys = []
        for number, token in enumerate(_tokens(text), start=1):
            try:
                key = base64.b64decode(token, validate=True)
            except (binascii.Error, ValueError):
                raise KeyringError(f"{source}: key {number} is not base64") from None
            if len(key) != KEY_BYTES:
                raise KeyringError(
                    f"{source}: key {number} is {len(key)} bytes; a key is {KEY_BYTES} random bytes in "
                    "base64 (`webhook-worker keys generate`)"
                )
            keys.append(key)
        if not keys:
            raise KeyringError(f"{source}: no key found")
        return cls(keys)

    def seal(self, plaintext: str, purpose: str, endpoint_id: int | None = None) -> str:
        """The envelope of plaintext for this purpose; bound to the endpoint when one is given (every
        credential the product stores is; unbound is the form of values sealed before binding)."""
        aad = purpose if endpoint_id is None else bound(purpose, endpoint_id)
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[self.primary_id].encrypt(nonce, plaintext.encode(), aad.encode())
        return f"{PREFIX}{self.primary_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, value: str, purpose: str, endpoint_id: int | None = None,
             allow_plaintext: bool = False) -> str:
        """The plaintext of an envelope. With an endpoint id, a value bound to that endpoint opens,
        and so does one sealed before values were bound (until `keys rotate` binds it); one bound to
        another endpoint does not. A plaintext value (stored before encryption existed) is returned
        as it is only with allow_plaintext; otherwise UnsealedValue."""
        if not is_sealed(value):
            if allow_plaintext:
                return value
            raise UnsealedValue(
                f"{purpose} is stored unsealed and security.require_sealed refuses plaintext; "
                "run `webhook-worker keys rotate` to seal it")
        if endpoint_id is None:
            return self._open(value, purpose)
        try:
            return self._open(value, bound(purpose, endpoint_id))
        except DecryptionError:
            try:
                return self._open(value, purpose)  # sealed before values were bound to their endpoint
            except DecryptionError:
                pass
            raise

    def is_bound(self, value: str, purpose: str, endpoint_id: int) -> bool:
        """Whether the value is sealed bound to this endpoint (not plaintext, not an older form)."""
        try:
            self._open(value, bound(purpose, endpoint_id))  # plaintext raises too
        except DecryptionError:
            return False
        return True

    def _open(self, value: str, aad: str) -> str:
        if not is_sealed(value):
            raise DecryptionError("not a sealed value")
        kid, _, blob = value[len(PREFIX) :].partition(":")
        aead = self._keys.get(kid)
        if aead is None:
            raise DecryptionError(f"sealed with key {kid}, which this keyring does not hold")
        try:
            raw = base64.urlsafe_b64decode(blob)
            return aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad.encode()).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise DecryptionError(
                f"a value sealed with key {kid} does not open (tampered or moved from another field "
                "or endpoint)") from None

    def reseal(self, value: str, purpose: str, endpoint_id: int) -> str:
        """The value sealed with the primary key and bound to its endpoint (unchanged if it already
        is); plaintext and values sealed before binding are sealed bound."""
        if sealed_key_id(value) == self.primary_id and self.is_bound(value, purpose, endpoint_id):
            return value
        return self.seal(self.open(value, purpose, endpoint_id, allow_plaintext=True), purpose, endpoint_id)

    def seal_settings(self, settings: Mapping[str, str], endpoint_id: int) -> dict[str, str]:
        return {name: self.seal(str(value), setting(name), endpoint_id) for name, value in settings.items()}

    def open_settings(self, settings: Mapping[str, str], endpoint_id: int,
                      allow_plaintext: bool = False) -> dict[str, str]:
        return {name: self.open(str(value), setting(name), endpoint_id, allow_plaintext)
                for name, value in settings.items()}

    def seal_headers(self, headers: Mapping[str, str], endpoint_id: int) -> dict[str, str]:
        return {name: self.seal(str(value), header(name), endpoint_id) for name, value in headers.items()}

    def open_headers(self, headers: Mapping[str, str], endpoint_id: int,
                     allow_plaintext: bool = False) -> dict[str, str]:
        return {str(name): self.open(str(value), header(name), endpoint_id, allow_plaintext)
                for name, value in headers.items()}


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    for line in text.splitlines():
        line = line.partition("#")[0]
        tokens.extend(t for t in line.replace(",", " ").split() if t)
    return tokens


def load_keyring(keys_file: str | None, environ: Mapping[str, str]) -> Keyring:
    """The keyring from WEBHOOK_WORKER_ENCRYPTION_KEYS, else from the file (a mounted Secret)."""
    text = environ.get(KEYS_ENV, "").strip()
    if text:
        return Keyring.parse(text, KEYS_ENV)
    if keys_file:
        try:
            content = Path(keys_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyringError(
                f"security.encryption_keys_file: cannot read {keys_file}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise KeyringError(
                f"security.encryption_keys_file: {keys_file} is not text; keys are base64 "
                "(`openssl rand -base64 32`)"
            ) from None
        return Keyring.parse(content, f"security.encryption_keys_file ({keys_file})")
    raise KeyringError(
        f"encryption key missing: set {KEYS_ENV} or security.encryption_keys_file "
        "(make one with `webhook-worker keys generate`)"
    )
