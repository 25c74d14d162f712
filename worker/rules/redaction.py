"""What a stored text may keep of an endpoint URL: the secret-bearing parts cut out. No I/O.

A receiver's answer can quote the URL it was sent to (Express answers an unknown route with
`Cannot POST /services/T0/B0/<token>?token=…`, a redirect page says `Redirecting to …`), and so can
an error text. Slack-style URLs carry their credential in the path, others in the query or in
`user:password@`; only `scheme://host:port` is public (delivery.display_url). So before a receiver's
excerpt or an error text is stored, every form in which the path, query, fragment or userinfo can
come back is replaced by REDACTED, while the opened URL is still in hand.
"""

from __future__ import annotations

import base64
import html
import re
import string
from urllib.parse import quote, unquote, unquote_plus, urlsplit

import yarl

REDACTED = "[redacted]"
# A piece of the URL shorter than this is not replaced on its own, only inside the longer pieces it
# belongs to (the whole path, the query, `user:password`). The secret-bearing parts are long
# (Slack's path token has 24 characters, Mattermost's 26, Discord's 68; query tokens and API keys
# 20 or more), while short pieces are what any text is made of: a path of "/" would otherwise
# redact every slash, and "/api", "v1", "hooks" or "?page=2" every mention of them. Eight
# characters keep most words apart from the secrets (a piece as long as "services" or "webhooks"
# is still redacted wherever it appears), and a credential shorter than that is guessed, not read.
MIN_SECRET_CHARS = 8
# Forms are matched regardless of ASCII case (%2f and %2F; a receiver that upper-cases its echo);
# folding ASCII only keeps every character where it was, so positions carry over to the text.
_ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_QUERY_FIELDS = re.compile("[&;]")
_UNRESERVED = re.compile("[A-Za-z0-9._~-]*")
_RUN_BREAKS = re.compile("%[0-9A-Fa-f]{2}|[^A-Za-z0-9._~-]")
# quote(text, safe="") for ASCII text, in one pass
_PERCENT_ENCODED = {c: f"%{c:02X}" for c in range(128)
                    if chr(c) not in string.ascii_letters + string.digits + "-._~"}
_HTML_SPECIAL = re.compile("[&<>\"']")


def redact(text: str, url: str, cut: bool = False) -> str:
    """The text with every form of the URL's secret-bearing parts (secret_forms) replaced by
    REDACTED. `cut`: the text is the start of a longer one, so it may end inside a secret; a tail
    that begins one (MIN_SECRET_CHARS or more of it) is replaced too."""
    if len(text) < MIN_SECRET_CHARS or not url:
        return text
    folded = _fold(text)
    spans: list[tuple[int, int]] = []
    # a text that was cut may hold the start of a form only: every form is looked for
    for form in secret_forms(url, None if cut else folded):
        at = folded.find(form)
        while at != -1:
            spans.append((at, at + len(form)))
            at = folded.find(form, at + 1)
        if cut:
            spans += _cut_inside(folded, form)
    if not spans:
        return text
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:  # overlapping or touching: one marker
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    kept, end = [], 0
    for start, stop in merged:
        kept += [text[end:start], REDACTED]
        end = stop
    kept.append(text[end:])
    return "".join(kept)


def _fold(text: str) -> str:
    return text.lower() if text.isascii() else text.translate(_ASCII_FOLD)


def _cut_inside(folded: str, form: str) -> list[tuple[int, int]]:
    """The longest tail of the text that is the start of the form (a secret cut off by the text's
    end), at least MIN_SECRET_CHARS long; the form's whole occurrences are found apart."""
    opening = form[:MIN_SECRET_CHARS]
    at = folded.find(opening, max(0, len(folded) - len(form) + 1))
    while at != -1:
        if form.startswith(folded[at:]):
            return [(at, len(folded))]
        at = folded.find(opening, at + 1)
    return []


def secret_forms(url: str, within: str | None = None) -> list[str]:
    """Every form in which the URL's path, query, fragment and userinfo may come back in a text,
    ASCII case folded, longest first: each part whole and in its pieces (path segments, query
    fields and values, user and password), as stored, as sent (aiohttp sends what yarl makes of the
    URL), percent-decoded, percent-encoded whole, HTML-escaped, and the `Authorization: Basic`
    value the userinfo is sent as. Pieces shorter than MIN_SECRET_CHARS are left out.

    `within`: a folded text; the forms of a piece that cannot occur in it are left out too. Each
    form of a piece keeps the piece's runs of unreserved characters (decoding and encoding change
    only escapes and other characters), so a text without its longest run holds none of them:
    this spares building forms for every answer that quotes nothing of the URL."""
    pieces: set[str] = set()
    stored, sent = _parts(url), _as_sent(url)
    for user, password, path, query, fragment in {stored, sent}:  # usually one and the same
        if user is not None:
            pieces |= {user if password is None else f"{user}:{password}", user, password or ""}
        target = f"{path}?{query}" if query else path
        pieces |= {target, f"{target}#{fragment}" if fragment else target, path, query, fragment}
        pieces.update(path.split("/"))
        for field in _QUERY_FIELDS.split(query):
            pieces |= {field, field.partition("=")[2]}
    forms: set[str] = set()
    for piece in pieces:
        if len(piece) < MIN_SECRET_CHARS:
            continue
        plain = _UNRESERVED.fullmatch(piece)  # the usual token: it has no other form
        if within is not None and _fold(piece if plain else _longest_run(piece)) not in within:
            continue
        forms.add(piece)
        if plain:
            continue
        decoded = unquote(piece) if "%" in piece else piece
        forms.add(decoded)
        if "+" in piece:
            forms.add(unquote_plus(piece))
        # encoded whole (a URL inside another's query: `?next=%2Fservices%2F…`)
        forms.add(decoded.translate(_PERCENT_ENCODED) if decoded.isascii() else quote(decoded, safe=""))
        forms |= {html.escape(v) for v in (piece, decoded) if _HTML_SPECIAL.search(v)}
    if sent[0] is not None:
        forms.add(_basic_credentials(unquote(sent[0]), unquote(sent[1] or "")))
    folded = {_fold(f) for f in forms if len(f) >= MIN_SECRET_CHARS}
    found = folded if within is None else {f for f in folded if f in within}
    return sorted(found, key=lambda f: (-len(f), f))


def _longest_run(piece: str) -> str:
    return max(_RUN_BREAKS.split(piece), key=len)


Parts = tuple[str | None, str | None, str, str, str]  # user, password, path, query, fragment


def _parts(url: str) -> Parts:
    """The URL split as RFC 3986 does it, for any string (a URL that does not parse is still
    split, never refused: this runs on what is stored, whatever it is)."""
    rest = url.partition("://")[2] or url
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i != -1]
    authority, tail = (rest[:min(ends)], rest[min(ends):]) if ends else (rest, "")
    userinfo, at, _ = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not at:
        return None, None, *_path_query_fragment(tail)
    return user, password if colon else None, *_path_query_fragment(tail)


def _path_query_fragment(tail: str) -> tuple[str, str, str]:
    tail, _, fragment = tail.partition("#")
    path, _, query = tail.partition("?")
    return path, query, fragment


def _as_sent(url: str) -> Parts:
    """The parts as aiohttp sends them: yarl's encoding of the URL (it quotes what needs quoting
    and decodes escapes it need not keep, `%41` to `A`)."""
    try:
        parsed = yarl.URL(url)
        return (parsed.raw_user, parsed.raw_password, parsed.raw_path, parsed.raw_query_string,
                parsed.raw_fragment)
    except (ValueError, TypeError):
        return None, None, "", "", ""


def _basic_credentials(user: str, password: str) -> str:
    """The userinfo as aiohttp sends it (BasicAuth: latin-1, base64): an echo of the request's
    headers would quote it."""
    try:
        raw = f"{user}:{password}".encode("latin-1")
    except UnicodeEncodeError:
        raw = f"{user}:{password}".encode()
    return base64.b64encode(raw).decode()


def display_url(url: str) -> str:
    """Scheme, host and port only: what may appear in logs (paths and queries can be secrets; what
    a stored text may keep of the rest is redact()'s)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(invalid URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"
