"""Request bodies per endpoint format: raw, the Standard Webhooks envelope, Slack, Mattermost and
PagerDuty Events API v2. Pure functions: payload in, bytes out, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

FORMATS = ("raw", "envelope", "slack", "mattermost", "pagerduty")
PAGERDUTY_SEVERITIES = {
    "critical": "critical", "fatal": "critical", "p1": "critical", "high": "critical",
    "error": "error", "major": "error", "p2": "error",
    "warning": "warning", "warn": "warning", "medium": "warning", "minor": "warning", "p3": "warning",
    "info": "info", "low": "info", "ok": "info", "p4": "info", "p5": "info",
}
RESOLVED_STATUSES = {"resolved", "cleared", "ok", "closed"}
SEVERITY_COLOURS = {"critical": "#d00000", "error": "#e36209", "warning": "#f0b400", "info": "#2f81f7"}


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
    if body_format == "raw":
        return payload
    data = json.loads(payload)
    if body_format == "envelope":
        body: Any = {"id": event.event_id, "type": event.event_type,
                     "timestamp": event.created_at.isoformat(), "data": data}
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
    if not isinstance(title, str) or not title.strip():
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
    """Slack incoming webhook: `text` (the notification fallback) plus Block Kit blocks."""
    alert = _alert(data)
    headline = _headline(alert, event)
    link = _text(alert.get("url") or alert.get("link"))
    section = f"*<{link}|{headline}>*" if link else f"*{headline}*"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": section}}]
    context = [f"{name}: {value}" for name, value in (("Severity", _text(alert.get("severity"))),
                                                      ("Source", _text(alert.get("source"))))
               if value]
    if context:
        blocks.append({"type": "context",
                       "elements": [{"type": "mrkdwn", "text": " | ".join(context)}]})
    return {"text": headline, "blocks": blocks}


def mattermost(data: Any, event: Event) -> dict[str, Any]:
    """Mattermost incoming webhook: `text` plus one attachment with the alert's fields."""
    alert = _alert(data)
    headline = _headline(alert, event)
    severity = _text(alert.get("severity"))
    attachment: dict[str, Any] = {"fallback": headline, "title": _title(alert),
                                  "color": "#2da44e" if _resolved(alert, event)
                                  else SEVERITY_COLOURS.get(PAGERDUTY_SEVERITIES.get(
                                      (severity or "").lower(), ""), "#808080")}
    link = _text(alert.get("url") or alert.get("link"))
    if link:
        attachment["title_link"] = link
    fields = [{"short": True, "title": name, "value": value}
              for name, value in (("Severity", severity), ("Source", _text(alert.get("source")))) if value]
    if fields:
        attachment["fields"] = fields
    return {"text": headline, "attachments": [attachment]}


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
            "summary": _title(alert)[:1024],
            "source": _text(alert.get("source")) or "webhook-worker",
            "severity": severity,
            "timestamp": event.created_at.isoformat(),
            "custom_details": dict(alert),
        },
    }
    link = _text(alert.get("url") or alert.get("link"))
    if link:
        body["links"] = [{"href": link, "text": "Alert"}]
    return body
