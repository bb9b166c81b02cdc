"""Alerts: who wants to hear about which models, where to tell them, and what was sent."""

from __future__ import annotations

import secrets
import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from registry.derivatives import bases
from registry.models import EventKind, HubModel, ModelEvent, Verdict

from .notifications import model_path as repo_page_path

#: How many characters of an error we keep (a webhook may answer with a whole HTML page).
ERROR_CHARS = 500


def new_secret() -> str:
    return secrets.token_hex(32)


def validate_webhook_url(value: str) -> None:
    """http/https with a host; the outbound client vets the address itself at send time."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValidationError("Enter an http:// or https:// URL.", code="invalid_url")
    if parts.username or parts.password:
        raise ValidationError("Credentials in the URL are not supported.", code="invalid_url")


class Team(models.Model):
    """People who share channels (a team's webhook reaches every member's subscriptions)."""

    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="alert_teams")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name


class TeamInvitation(models.Model):
    """An invitation to a team, mailed as a link (alerts.tokens.invite_token) that only the
    invited address can accept, once. Deleted when its sender leaves the team, and with the
    team: so a sender back in the team brings no old invitation back."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    address = models.EmailField(max_length=254)
    created_at = models.DateTimeField(default=timezone.now)
    accepted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.address} to {self.team}"


class ChannelKind(models.TextChoices):
    EMAIL = "email", "Email"
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack incoming webhook"
    DISCORD = "discord", "Discord webhook"


class ChannelQuerySet(models.QuerySet["Channel"]):
    def owned_by(self, user: Any) -> ChannelQuerySet:
        """The user's own channels and those of their teams."""
        if not user.is_authenticated:
            return self.none()
        teams = Team.objects.filter(members=user).values("pk")
        return self.filter(Q(owner=user) | Q(team__in=teams))

    def deliverable(self) -> ChannelQuerySet:
        return self.filter(confirmed_at__isnull=False, disabled_at__isnull=True)


class Channel(models.Model):
    """Where alerts go: an email address or a webhook, owned by a person or a team."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_channels",
    )
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="channels"
    )
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    name = models.CharField(max_length=100, blank=True)
    address = models.EmailField(blank=True)
    url = models.URLField(max_length=2000, blank=True, validators=[validate_webhook_url])
    #: The HMAC key of the generic webhook's signature header; shown to the owner only.
    secret = models.CharField(max_length=64, default=new_secret)
    #: Collect events and send one message a day instead of one per event.
    digest = models.BooleanField(default=False)
    #: Email addresses are confirmed by a signed link first; webhooks on creation.
    confirmed_at = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.TextField(blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = ChannelQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(owner__isnull=False) | Q(team__isnull=False),
                name="channel_has_an_owner_or_team",
            )
        ]

    def __str__(self) -> str:
        return self.name or f"{self.get_kind_display()} {self.display_target}"

    @property
    def is_email(self) -> bool:
        return self.kind == ChannelKind.EMAIL

    @property
    def is_active(self) -> bool:
        return self.confirmed_at is not None and self.disabled_at is None

    @property
    def display_target(self) -> str:
        """The address, or a webhook URL without path and query (they often hold its secret)."""
        if self.is_email:
            return self.address
        parts = urlsplit(self.url)
        secret = parts.path.strip("/") or parts.query or parts.fragment
        return f"{parts.scheme}://{parts.netloc}/…" if secret else self.url

    def disable(self, reason: str) -> None:
        """Stop sending here; the reason is shown to the owner on the settings page."""
        now = timezone.now()
        Channel.objects.filter(pk=self.pk, disabled_at__isnull=True).update(
            disabled_at=now, disabled_reason=reason[:ERROR_CHARS]
        )
        self.disabled_at, self.disabled_reason = now, reason[:ERROR_CHARS]

    def record_success(self) -> None:
        Channel.objects.filter(pk=self.pk).update(last_success_at=timezone.now())

    def record_error(self, error: str) -> None:
        Channel.objects.filter(pk=self.pk).update(
            last_error=error[:ERROR_CHARS], last_error_at=timezone.now()
        )


class SubscriptionTarget(models.TextChoices):
    MODEL = "model", "A model"
    AUTHOR = "author", "An author or organisation"
    RULE = "rule", "A rule"


class Rule(models.TextChoices):
    TURNS_UNSAFE = "turns_unsafe", "Any tracked model that turns unsafe"
    BASE_FIXED = (
        "base_fixed",
        "Any derivative that still carries a template its base has fixed",
    )


#: Which subscription flag asks for which event kind.
EVENT_FLAGS: dict[str, str] = {
    EventKind.TEMPLATE_CHANGED: "on_template",
    EventKind.VERDICT_CHANGED: "on_verdict",
    EventKind.PROBE_CHANGED: "on_probe",
    EventKind.STATUS_CHANGED: "on_status",
    EventKind.BASE_FIXED: "on_base_fixed",
}
#: Which rule hears which events (a rule has no event flags of its own).
RULE_EVENTS: dict[str, str] = {
    Rule.TURNS_UNSAFE: EventKind.VERDICT_CHANGED,
    Rule.BASE_FIXED: EventKind.BASE_FIXED,
}


class SubscriptionQuerySet(models.QuerySet["Subscription"]):
    def matching(self, event: ModelEvent) -> SubscriptionQuerySet:
        """Subscriptions that want this event (on a channel that can receive it)."""
        model: HubModel = event.model
        wants = Q(target=SubscriptionTarget.MODEL, model_id=model.pk) | Q(
            target=SubscriptionTarget.AUTHOR, author__iexact=model.author
        )
        if model.base_model:
            # A subscription to a base that includes its derivatives, at any tracked level.
            chain = [base.pk for base in bases(model)]
            wants |= Q(target=SubscriptionTarget.MODEL, with_derivatives=True, model_id__in=chain)
        flag = EVENT_FLAGS.get(event.kind)
        flagged = self.filter(wants, **{flag: True}) if flag else self.none()
        rules = self.none()
        if event.kind == EventKind.VERDICT_CHANGED and event.data.get("new") == Verdict.UNSAFE:
            rules = self.filter(target=SubscriptionTarget.RULE, rule=Rule.TURNS_UNSAFE)
        elif event.kind == EventKind.BASE_FIXED:
            rules = self.filter(target=SubscriptionTarget.RULE, rule=Rule.BASE_FIXED)
        # Only on a channel its subscriber may still use: their own, or their team's while they
        # are in it (a subscription left behind on a team's channel must not reach the team).
        usable = Q(channel__owner=F("user")) | Q(channel__team__members=F("user"))
        return (
            (flagged | rules)
            .filter(channel__in=Channel.objects.deliverable())
            .filter(usable)
            .distinct()
        )


class Subscription(models.Model):
    """One person's wish to hear about a model, an author or a rule, on one channel."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_subscriptions"
    )
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="subscriptions")
    target = models.CharField(max_length=10, choices=SubscriptionTarget.choices)
    model = models.ForeignKey(
        HubModel, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    author = models.CharField(max_length=100, blank=True)
    rule = models.CharField(max_length=32, blank=True, choices=Rule.choices)
    on_template = models.BooleanField("Template changed", default=True)
    on_verdict = models.BooleanField("Verdict changed", default=True)
    on_probe = models.BooleanField("Probe result changed", default=True)
    on_status = models.BooleanField("Repo gated or gone", default=True)
    on_base_fixed = models.BooleanField("Still carries a template its base has fixed", default=True)
    #: A model subscription that also hears about the model's tracked derivatives
    #: (quantizations, conversions, fine-tunes, at every level).
    with_derivatives = models.BooleanField("Include its derivatives", default=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = SubscriptionQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.describe()} → {self.channel}"

    def describe(self) -> str:
        if self.target == SubscriptionTarget.MODEL and self.model is not None:
            if self.with_derivatives:
                return f"{self.model.repo_id} and its derivatives"
            return self.model.repo_id
        if self.target == SubscriptionTarget.AUTHOR:
            return f"every model by {self.author}"
        return self.get_rule_display()

    @property
    def model_path(self) -> str | None:
        return repo_page_path(self.model.repo_id) if self.model is not None else None

    @property
    def feed_url(self) -> str | None:
        """The Atom feed of the same changes (the dashboard's), for readers without an account."""
        try:
            if self.model is not None:
                return reverse("dashboard:model_feed", args=self.model.repo_id.split("/", 1))
            if self.author:
                return reverse("dashboard:author_feed", args=[self.author])
            return reverse("dashboard:feed")
        except NoReverseMatch:
            return None

    @property
    def event_labels(self) -> list[str]:
        if self.target == SubscriptionTarget.RULE:
            return [EventKind(RULE_EVENTS.get(self.rule, EventKind.VERDICT_CHANGED)).label]
        return [EventKind(kind).label for kind, flag in EVENT_FLAGS.items() if getattr(self, flag)]


class SendStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DIGEST = "digest", "Waiting for the daily digest"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class SendRecord(models.Model):
    """Written before a send and updated after, so a retry resends only what did not succeed."""

    status = models.CharField(
        max_length=10, choices=SendStatus.choices, default=SendStatus.PENDING, db_index=True
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    #: When a retry is due (None: not waiting for one); the sweeper looks for overdue ones.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class Digest(SendRecord):
    """One channel's daily message, collecting the deliveries that waited for it."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="digests")
    day = models.DateField()

    class Meta:
        ordering = ["-day", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["channel", "day"], name="one_digest_per_channel_day")
        ]

    def __str__(self) -> str:
        return f"digest {self.day} for {self.channel}"

    @property
    def idempotency_key(self) -> str:
        return f"digest-{self.channel_id}-{self.day.isoformat()}"


class Delivery(SendRecord):
    """One event on one channel: at most one per pair, whatever retries and duplicates do."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    event = models.ForeignKey(ModelEvent, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    digest = models.ForeignKey(
        Digest, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["event", "channel"], name="one_delivery_per_channel")
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.channel}: {self.status}"

    @property
    def idempotency_key(self) -> str:
        return str(self.uuid)
