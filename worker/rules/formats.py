"""Request bodies per endpoint format: raw, the Standard Webhooks envelope, Slack, Mattermost and
PagerDuty Events API v2, and digests of several alerts. Pure functions: payload in, bytes out, no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

RAW = "raw"  # the payload as published, byte for byte
FORMATS = (RAW, "envelope", "slack", "mattermost", "pagerduty")
PAGERDUTY_SEVERITIES = {
    "critical": "critical", "fatal": "critical", "p1": "critical", "high": "critical",
    "error": "error", "major": "error", "p2": "error",
    "warning": "warning", "warn": "warning", "medium": "warning", "minor": "warning", "p3": "warning",
    "info": "info", "low": "info", "ok": "info", "p4": "info", "p5": "info",
}
RESOLVED_STATUSES = {"resolved", "cleared", "ok", "closed"}
SEVERITY_COLOURS = {"critical": "#d00000", "error": "#e36209", "warning": "#f0b400", "info": "#2f81f7"}
ELLIPSIS = "…"
# Slack Block Kit: a section's text may hold 3,000 characters; the top-level `text` is the
# notification fallback, kept to the same size. A context element's text is kept far shorter.
SLACK_SECTION_CHARS = 3000
SLACK_CONTEXT_VALUE_CHARS = 300
# Mattermost: a message holds 16,383 characters and all of a post's attachments 7,900 together;
# these caps keep one alert well inside both.
MATTERMOST_TEXT_CHARS = 4000
MATTERMOST_TITLE_CHARS = 1000
MATTERMOST_FIELD_CHARS = 300
MATTERMOST_LINK_CHARS = 2000
PAGERDUTY_SUMMARY_CHARS = 1024
# Digests: this many alerts are named, most severe first; the rest are counted. Each
# named line is kept short, so the list fits one Slack section (3,000 characters) and a Mattermost
# message with room to spare.
DIGEST_LISTED = 10
DIGEST_LINE_CHARS = 280
# The digest header's order: most severe first, resolved last.
DIGEST_RANKS = ("critical", "error", "warning", "info", "other", "resolved")
# Characters that end or split a Slack link (`<url|label>`) if left in its URL.
_SLACK_URL_UNSAFE = {"<": "%3C", ">": "%3E", "|": "%7C", " ": "%20"}
# Mattermost turns these words into notifications for a whole channel or team.
_MATTERMOST_MENTIONS = re.compile(r"@(channel|all|here)\b", re.IGNORECASE)


class FormatError(ValueError):
    """The payload lacks something this format needs; the message names the field."""


@dataclass(frozen=True)
class Event:
    """What a formatter may use besides the payload."""

    event_id: str
    event_type: str
    created_at: datetime
    secret_settings: Mapping[str, Any]


def render(body_format: str, payload: bytes, event: Event) -> bytes:
    if body_format == RAW:
        return payload
    try:
        return _render_json(body_format, payload, event)
    except RecursionError:
        # PostgreSQL's jsonb nests far deeper than Python's parser: such a payload can only go raw.
        raise FormatError("payload: nested too deeply to parse (send it with format raw)") from None


def _render_json(body_format: str, payload: bytes, event: Event) -> bytes:
    data = json.loads(payload)
    if body_format == "envelope":
        body: Any = _envelope(data, event)
    elif body_format == "slack":
        body = slack(data, event)
    elif body_format == "mattermost":
        body = mattermost(data, event)
    elif body_format == "pagerduty":
        body = pagerduty(data, event)
    else:
        raise FormatError(f"unknown body format {body_format!r}")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _alert(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise FormatError("payload: an alert must be a JSON object")
    return data


def _title(alert: Mapping[str, Any]) -> str:
    title = alert.get("title") or alert.get("summary")
    if isinstance(title, int | float) and not isinstance(title, bool):
        title = str(title)
    if title is not None and not isinstance(title, str):
        raise FormatError("payload.title: must be a string or a number")
    if title is None or not title.strip():
        raise FormatError("payload.title: missing (an alert needs a title or summary)")
    return title.strip()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _resolved(alert: Mapping[str, Any], event: Event) -> bool:
    status = str(alert.get("status", "")).lower()
    cleared = status in RESOLVED_STATUSES or alert.get("resolved") is True
    return cleared or event.event_type.endswith(".resolved")


def _headline(alert: Mapping[str, Any], event: Event) -> str:
    severity = _text(alert.get("severity"))
    prefix = "[RESOLVED] " if _resolved(alert, event) else (f"[{severity.upper()}] " if severity else "")
    return prefix + _title(alert)


def slack(data: Any, event: Event) -> dict[str, Any]:
    """Slack incoming webhook: `text` (the notification fallback) plus Block Kit blocks. Alert text
    is escaped for mrkdwn, so `&`, `<` and `>` from a producer can neither end the link nor make
    one (`<!channel>`), and every text fits Block Kit's limits."""
    alert = _alert(data)
    headline = _headline(alert, event)
    link = _link(alert)
    section = f"*{_fit(headline, SLACK_SECTION_CHARS - 2, _slack_escape)}*"
    if link:
        target = _slack_url(link)
        # room for "*<" + target + "|" + label + ">*"; a link too long to leave a readable label is dropped
        room = SLACK_SECTION_CHARS - len(target) - 5
        if room >= 100:
            # a `|` in a label is taken as the URL's end by some clients: show a look-alike
            section = f"*<{target}|{_fit(headline.replace('|', '¦'), room, _slack_escape)}>*"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": section}}]
    context = [f"{name}: {_fit(value, SLACK_CONTEXT_VALUE_CHARS, _slack_escape)}"
               for name, value in (("Severity", _text(alert.get("severity"))),
                                   ("Source", _text(alert.get("source"))))
               if value]
    if context:
        blocks.append({"type": "context",
                       "elements": [{"type": "mrkdwn", "text": " | ".join(context)}]})
    return {"text": _fit(headline, SLACK_SECTION_CHARS, _slack_escape), "blocks": blocks}


def mattermost(data: Any, event: Event) -> dict[str, Any]:
    """Mattermost incoming webhook: `text` plus one attachment with the alert's fields. Markdown
    from a producer is shown as written (escaped), channel-wide mentions are defused, and every
    field fits Mattermost's limits."""
    alert = _alert(data)
    headline = _headline(alert, event)
    severity = _text(alert.get("severity"))
    link = _link(alert)
    if link is not None and len(link) > MATTERMOST_LINK_CHARS:
        link = None
    headline, title = _markdown_defused(headline), _markdown_defused(_title(alert))
    attachment: dict[str, Any] = {
        "fallback": _fit(headline, MATTERMOST_TITLE_CHARS, str),
        # Mattermost shows a linked title as plain text and an unlinked one as Markdown.
        "title": _fit(title, MATTERMOST_TITLE_CHARS, str if link else _markdown_escape),
        "color": "#2da44e" if _resolved(alert, event)
        else SEVERITY_COLOURS.get(PAGERDUTY_SEVERITIES.get((severity or "").lower(), ""), "#808080"),
    }
    if link:
        attachment["title_link"] = link
    fields = [{"short": True, "title": name, "value": _fit(_markdown_defused(value), MATTERMOST_FIELD_CHARS,
                                                                _markdown_escape)}
              for name, value in (("Severity", severity), ("Source", _text(alert.get("source")))) if value]
    if fields:
        attachment["fields"] = fields
    return {"text": _fit(headline, MATTERMOST_TEXT_CHARS, _markdown_escape), "attachments": [attachment]}


def _link(alert: Mapping[str, Any]) -> str | None:
    return _text(alert.get("url") or alert.get("link"))


def _fit(text: str, limit: int, escape: Callable[[str], str]) -> str:
    """The text escaped, cut with an ellipsis so that what is sent holds at most `limit` characters;
    never cuts an escape sequence in half."""
    escaped = escape(text)
    if len(escaped) <= limit:
        return escaped
    pieces: list[str] = []
    used = 0
    for char in text:
        piece = escape(char)
        if used + len(piece) > limit - len(ELLIPSIS):
            break
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces) + ELLIPSIS


def _slack_escape(text: str) -> str:
    # Slack's own rule for mrkdwn: these three, and only these, as HTML entities.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_url(url: str) -> str:
    return "".join(_SLACK_URL_UNSAFE.get(char, char) for char in url).replace("&", "&amp;")


def _markdown_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in _MARKDOWN_INLINE else char for char in text)


def _markdown_defused(text: str) -> str:
    """Producer text that Markdown must not read as a block (heading, quote, list) or a mention of
    a whole channel: a word joiner (U+2060, invisible) in front breaks each of them."""
    text = _MATTERMOST_MENTIONS.sub("@\u2060\\1", text)
    return _MARKDOWN_LINE_START.sub("\\1\u2060", text)


# Backslash escapes for what Markdown reads inside a line (links, emphasis, code, HTML, tables).
_MARKDOWN_INLINE = frozenset("\\`*_[]<>~|&")
_MARKDOWN_LINE_START = re.compile(r"^(\s*)(?=>|(?:#+|[+\-*]|\d+[.)])(?:\s|$))", re.MULTILINE)


def pagerduty(data: Any, event: Event) -> dict[str, Any]:
    """PagerDuty Events API v2. The dedup_key is the event's id (or the payload's own dedup_key,
    which a source that later resolves the alert sets in both events), so retries and replays
    never open a second incident."""
    alert = _alert(data)
    routing_key = event.secret_settings.get("routing_key")
    if not routing_key:
        raise FormatError("endpoint secret settings: routing_key missing (required by PagerDuty)")
    dedup_key = _text(alert.get("dedup_key")) or event.event_id
    if _resolved(alert, event):
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}
    severity = PAGERDUTY_SEVERITIES.get(str(alert.get("severity", "")).lower(), "error")
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key,
        "payload": {
            "summary": _fit(_title(alert), PAGERDUTY_SUMMARY_CHARS, str),
            "source": _text(alert.get("source")) or "webhook-worker",
            "severity": severity,
            "timestamp": event.created_at.isoformat(),
            "custom_details": dict(alert),
        },
    }
    link = _link(alert)
    if link:
        body["links"] = [{"href": link, "text": "Alert"}]
    return body


@dataclass(frozen=True)
class DigestItem:
    """One member of a digest, its payload parsed and checked for the format."""

    event: Event
    data: Any


def digest_item(body_format: str, payload: bytes, event: Event) -> DigestItem:
    """A member's payload, checked as its own message would be: a member that cannot be rendered
    fails alone (FormatError naming the field), and the digest goes without it."""
    try:
        data = json.loads(payload)
        if body_format in ("slack", "mattermost"):
            _title(_alert(data))
        elif body_format != "envelope":
            raise FormatError(f"body format {body_format!r} is never coalesced")
    except RecursionError:
        raise FormatError("payload: nested too deeply to parse (send it with format raw)") from None
    return DigestItem(event, data)


def render_digest(body_format: str, items: Sequence[DigestItem]) -> bytes:
    """One request body for several alerts: `{"type": "webhook.batch", "data": [envelope, ...]}`
    for envelope; for Slack and Mattermost a message with a count by severity, the most severe
    alerts named with their links, and how many more there are."""
    if body_format == "envelope":
        body: Any = {"type": "webhook.batch", "data": [_envelope(item.data, item.event) for item in items]}
    elif body_format == "slack":
        body = slack_digest(items)
    elif body_format == "mattermost":
        body = mattermost_digest(items)
    else:
        raise FormatError(f"body format {body_format!r} is never coalesced")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _envelope(data: Any, event: Event) -> dict[str, Any]:
    return {"id": event.event_id, "type": event.event_type, "timestamp": event.created_at.isoformat(),
            "data": data}


def _rank(alert: Mapping[str, Any], event: Event) -> str:
    if _resolved(alert, event):
        return "resolved"
    return PAGERDUTY_SEVERITIES.get(str(alert.get("severity", "")).lower(), "other")


def digest_header(items: Sequence[DigestItem]) -> str:
    """"37 alerts — 12 critical, 20 warning, 5 resolved": the count by severity, most severe first."""
    counts = {rank: 0 for rank in DIGEST_RANKS}
    for item in items:
        counts[_rank(_alert(item.data), item.event)] += 1
    parts = [f"{count} {rank}" for rank, count in counts.items() if count]
    return f"{len(items)} alerts — {', '.join(parts)}"


def most_severe_first(items: Sequence[DigestItem]) -> list[DigestItem]:
    """The members by severity, claim order kept within a severity (sorted() is stable)."""
    return sorted(items, key=lambda item: DIGEST_RANKS.index(_rank(_alert(item.data), item.event)))


def slack_digest(items: Sequence[DigestItem]) -> dict[str, Any]:
    header = digest_header(items)
    lines: list[str] = []
    used = 0
    for item in most_severe_first(items)[:DIGEST_LISTED]:
        alert = _alert(item.data)
        headline, link = _headline(alert, item.event), _link(alert)
        line = "• " + _fit(headline, DIGEST_LINE_CHARS, _slack_escape)
        if link and len(link) <= DIGEST_LINE_CHARS:
            label = _fit(headline.replace("|", "¦"), DIGEST_LINE_CHARS, _slack_escape)
            line = f"• <{_slack_url(link)}|{label}>"
        if used + len(line) + 1 > SLACK_SECTION_CHARS:
            break
        lines.append(line)
        used += len(line) + 1
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_slack_escape(header)}*"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}},
    ]
    more = len(items) - len(lines)
    if more:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"and {more} more"}]})
    return {"text": _slack_escape(header), "blocks": blocks}


def mattermost_digest(items: Sequence[DigestItem]) -> dict[str, Any]:
    header = digest_header(items)
    lines = [f"**{_markdown_escape(header)}**"]
    used = len(lines[0])
    listed = 0
    for item in most_severe_first(items)[:DIGEST_LISTED]:
        alert = _alert(item.data)
        headline, link = _markdown_defused(_headline(alert, item.event)), _link(alert)
        label = _fit(headline, DIGEST_LINE_CHARS, _markdown_escape)
        linked = link is not None and len(link) <= DIGEST_LINE_CHARS
        line = f"- [{label}]({_markdown_url(link)})" if linked and link else f"- {label}"
        if used + len(line) + 1 > MATTERMOST_TEXT_CHARS - 40:  # room for the "and N more" line
            break
        lines.append(line)
        used += len(line) + 1
        listed += 1
    if len(items) > listed:
        lines.append(f"and {len(items) - listed} more")
    return {"text": "\n".join(lines)}


def _markdown_url(url: str) -> str:
    # what would end a Markdown link's target early
    return "".join(_MARKDOWN_URL_UNSAFE.get(char, char) for char in url)


_MARKDOWN_URL_UNSAFE = {" ": "%20", "(": "%28", ")": "%29", "<": "%3C", ">": "%3E"}
