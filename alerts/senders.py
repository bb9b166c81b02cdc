"""Send a notification to one channel: signed JSON webhook, Slack, Discord or email.

Every webhook goes through `alerts.outbound` (the one client for user-supplied URLs). A send
either returns the receiver's status code or raises `SendFailure`, which says whether a later
attempt may succeed and whether the channel should be disabled.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import time
from typing import Any

from django.utils import timezone

from . import emails, outbound
from .models import Channel, ChannelKind
from .notifications import EventLine, Notification

SIGNATURE_HEADER = "X-CacheSafe-Signature"
TIMESTAMP_HEADER = "X-CacheSafe-Timestamp"
DELIVERY_HEADER = "X-CacheSafe-Delivery"
SCHEMA = "cachesafe.alert/1"
#: Slack allows 50 blocks and Discord 10 embeds a message; a digest shows this many events.
SLACK_MAX_EVENTS = 20
DISCORD_MAX_EMBEDS = 10
#: Below the broker's visibility timeout (1 h), so a waiting retry is not redelivered early.
RETRY_AFTER_MAX = 1800
#: Gone for good: the webhook was deleted (Slack answers 404 no_service / 410 channel archived).
DISABLING_CODES = frozenset({404, 410})
RETRYABLE_CODES = frozenset({408, 425, 429})
VERDICT_COLOURS = {"safe": 0x2E7D32, "unsafe": 0xC62828, "error": 0x6D4C41}


class SendFailure(Exception):
    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        retry: bool = True,
        disable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.retry, self.disable, self.retry_after = code, retry, disable, retry_after


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 over `<timestamp>.<raw body>` (docs/alerts.md)."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def webhook_body(notification: Notification) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "type": notification.type,
        "delivery_id": notification.key,
        "sent_at": timezone.now().isoformat(),
    }
    if notification.type == "digest":
        body["events"] = [line.as_json() for line in notification.events]
        body["more_events"] = notification.more
    else:
        body["event"] = notification.events[0].as_json()
    return body


def _slack_escape(text: str) -> str:
    # Slack's mrkdwn treats only these three as markup; `<…>` would otherwise become links.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "none"


def _change_text(line: EventLine) -> str:
    if line.kind == "template_changed":
        return f"{_short(line.old)} → {_short(line.new)}"
    return f"{line.old or 'unknown'} → {line.new or 'unknown'}"


def slack_payload(notification: Notification) -> dict[str, Any]:
    """`{"text", "blocks"}` of a Slack incoming webhook; `text` is the notification fallback."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": notification.subject[:150]}}
    ]
    for line in notification.events[:SLACK_MAX_EVENTS]:
        links = [f"<{line.model_url}|Model page>"]
        if line.diff_url:
            links.append(f"<{line.diff_url}|Diff>")
        text = (
            f"*{_slack_escape(line.kind_label)}: <{line.model_url}|{_slack_escape(line.repo_id)}>*"
            f"\n{_slack_escape(line.summary)}\nChange: `{_slack_escape(_change_text(line))}`"
        )
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}})
        verdict = f"Verdict: *{_slack_escape(line.verdict_label)}*"
        if line.verdict_summary:
            verdict += f" {_slack_escape(line.verdict_summary)}"
        blocks.append(
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": verdict[:2900]},
                    {"type": "mrkdwn", "text": " · ".join(links)},
                ],
            }
        )
    hidden = len(notification.events) - SLACK_MAX_EVENTS + notification.more
    if hidden > 0:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": f"…and {hidden} more."}}
        )
    return {"text": _slack_escape(notification.subject), "blocks": blocks}


_DISCORD_MARKUP = str.maketrans({c: f"\\{c}" for c in "\\*_~`|>[]()#-<@"})


def _discord_escape(text: str) -> str:
    return text.translate(_DISCORD_MARKUP)


def discord_payload(notification: Notification) -> dict[str, Any]:
    """`{"content", "embeds"}` of a Discord webhook; mentions are never parsed."""
    embeds = []
    for line in notification.events[:DISCORD_MAX_EMBEDS]:
        fields = [
            {"name": "Verdict", "value": line.verdict_label or "unknown", "inline": True},
            {"name": "Change", "value": _change_text(line)[:1024], "inline": True},
        ]
        if line.diff_url:
            fields.append({"name": "Diff", "value": line.diff_url, "inline": False})
        embeds.append(
            {
                "title": f"{line.kind_label}: {line.repo_id}"[:256],
                "url": line.model_url,
                "description": _discord_escape(f"{line.summary}\n{line.verdict_summary}".strip())[
                    :4000
                ],
                "color": VERDICT_COLOURS.get(line.verdict, 0x546E7A),
                "fields": fields,
                "timestamp": line.created_at.isoformat(),
            }
        )
    hidden = len(notification.events) - DISCORD_MAX_EMBEDS + notification.more
    content = _discord_escape(notification.subject)
    if hidden > 0:
        content += f" (and {hidden} more)"
    # allowed_mentions: nothing from the Hub can ping @everyone or a role.
    return {"content": content[:2000], "embeds": embeds, "allowed_mentions": {"parse": []}}


def send(channel: Channel, notification: Notification) -> int | None:
    """Send `notification` to `channel`; the receiver's status code (None for email)."""
    if channel.kind == ChannelKind.EMAIL:
        _send_email(channel, notification)
        return None
    payload: dict[str, Any]
    headers = {"Content-Type": "application/json", DELIVERY_HEADER: notification.key}
    if channel.kind == ChannelKind.SLACK:
        payload = slack_payload(notification)
    elif channel.kind == ChannelKind.DISCORD:
        payload = discord_payload(notification)
    else:
        payload = webhook_body(notification)
    body = json.dumps(payload, separators=(",", ":")).encode()
    if channel.kind == ChannelKind.WEBHOOK:
        timestamp = str(int(time.time()))
        headers |= {
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(channel.secret, timestamp, body),
            "X-CacheSafe-Event": notification.events[0].kind
            if notification.type != "digest"
            else "digest",
        }
    return _post(channel.url, body, headers)


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    try:
        response = outbound.post(url, body, headers)
    except outbound.Refused as exc:
        raise SendFailure(f"refused: {exc}", retry=False, disable=True) from exc
    except outbound.OutboundError as exc:
        raise SendFailure(str(exc)) from exc
    code = response.status
    if 200 <= code < 300:
        return code
    answer = response.body[:200].decode("utf-8", "replace").strip()
    message = f"HTTP {code}" + (f": {answer}" if answer else "")
    if code in DISABLING_CODES:
        raise SendFailure(f"the webhook is gone ({message})", code=code, retry=False, disable=True)
    if code in RETRYABLE_CODES or code >= 500:
        raise SendFailure(message, code=code, retry_after=_retry_after(response))
    raise SendFailure(message, code=code, retry=False)


def _retry_after(response: outbound.Response) -> float | None:
    """`Retry-After` in seconds, up to RETRY_AFTER_MAX; None for anything else (an HTTP date,
    or digits `int` refuses: "²" is a digit to `str.isdigit`, and 5,000 of them are too many)."""
    value = response.headers.get("retry-after", "").strip()
    if not (value.isascii() and value.isdigit()):
        return None
    return float(min(int(value[:12]), RETRY_AFTER_MAX))


def _send_email(channel: Channel, notification: Notification) -> None:
    message = emails.alert_email(channel, notification)
    try:
        message.send()
    except smtplib.SMTPRecipientsRefused as exc:
        raise SendFailure(
            f"the mail server refused {channel.address}: {exc}", retry=False, disable=True
        ) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailure(f"mail not sent: {exc}") from exc
