"""Forms of the alert pages; each one that picks a channel offers only the user's own.

A form holds the fields of the chosen kind only (an email channel has no URL, a subscription to
an author no model): the same field set is rendered, swapped in by htmx when the kind changes,
and validated, so a field the reader cannot see can never hold an error they cannot fix.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from registry.models import HubModel, validate_repo_id

from . import outbound
from .models import (
    Channel,
    ChannelKind,
    Rule,
    Subscription,
    SubscriptionTarget,
    Team,
)

AUTHOR_RE = re.compile(r"^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?$")

#: The fields that only some kinds of channel or subscription have, by kind.
CHANNEL_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    ChannelKind.EMAIL: ("address",),
    ChannelKind.WEBHOOK: ("url",),
    ChannelKind.SLACK: ("url",),
    ChannelKind.DISCORD: ("url",),
}
EVENT_FIELDS = ("on_template", "on_verdict", "on_probe", "on_status", "on_base_fixed")
TARGET_FIELDS: dict[str, tuple[str, ...]] = {
    SubscriptionTarget.MODEL: ("repo_id", "with_derivatives", *EVENT_FIELDS),
    SubscriptionTarget.AUTHOR: ("author", *EVENT_FIELDS),
    SubscriptionTarget.RULE: ("rule",),
}


def _chosen(form: forms.BaseForm, name: str, choices: dict[str, Any], default: str) -> str:
    """The kind the reader picked (posted, or asked for in the page's query), else the default."""
    value = form.data.get(form.add_prefix(name)) if form.is_bound else form.initial.get(name)
    return str(value) if value in choices else default


def _keep_only(form: forms.BaseForm, wanted: tuple[str, ...], optional: set[str]) -> None:
    for name in optional - set(wanted):
        del form.fields[name]


def _require(form: forms.BaseForm, name: str, message: str) -> None:
    """A field that only some kinds have is required where it is shown."""
    if name in form.fields:
        form.fields[name].required = True
        form.fields[name].error_messages["required"] = message


class ChannelForm(forms.ModelForm):  # type: ignore[type-arg]
    url = forms.URLField(
        label="Webhook URL", max_length=2000, required=False, assume_scheme="https"
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        required=False,
        empty_label="Just me",
        help_text="A team channel is shared: every member's subscriptions can use it.",
    )

    class Meta:
        model = Channel
        fields = ["kind", "name", "address", "url", "digest", "team"]
        labels = {
            "kind": "Send alerts by",
            "address": "Email address",
            "url": "Webhook URL",
            "digest": "Send one digest a day instead of one message per event",
        }

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chosen_kind = _chosen(self, "kind", CHANNEL_KIND_FIELDS, ChannelKind.EMAIL)
        _keep_only(self, CHANNEL_KIND_FIELDS[self.chosen_kind], {"address", "url"})
        _require(self, "address", "An email channel needs an address.")
        _require(self, "url", "A webhook channel needs its URL.")
        teams = Team.objects.filter(members=user)
        if teams.exists():
            self.fields["team"].queryset = teams  # type: ignore[attr-defined]
        else:
            del self.fields["team"]  # nothing to choose: the channel is the reader's own
        self.fields["name"].help_text = "How this channel is listed; its address if empty."

    @property
    def detail_fields(self) -> list[forms.BoundField]:
        """Every field after the kind, in the order the form shows them."""
        names = ("address", "url", "name", "digest", "team")
        return [self[name] for name in names if name in self.fields]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if (url := data.get("url")) and (kind_of_address := outbound.literal_refusal(url)):
            # Only a courtesy: the client checks every address again at send time, after DNS.
            self.add_error("url", f"Webhooks cannot go to a {kind_of_address} address.")
        return data


class SubscriptionForm(forms.Form):
    target = forms.ChoiceField(label="Subscribe to", choices=SubscriptionTarget.choices)
    repo_id = forms.CharField(label="Model (owner/name)", max_length=300, required=False)
    author = forms.CharField(label="Author or organisation", max_length=100, required=False)
    rule = forms.ChoiceField(label="Rule", choices=[("", "—"), *Rule.choices], required=False)
    channel = forms.ModelChoiceField(
        label="Send to", queryset=Channel.objects.none(), empty_label=None
    )
    on_template = forms.BooleanField(label="Template changed", required=False, initial=True)
    on_verdict = forms.BooleanField(label="Verdict changed", required=False, initial=True)
    on_probe = forms.BooleanField(label="Probe result changed", required=False, initial=True)
    on_status = forms.BooleanField(label="Repo gated or gone", required=False, initial=True)
    on_base_fixed = forms.BooleanField(
        label="A derivative still carries a template its base has fixed",
        required=False,
        initial=True,
    )
    with_derivatives = forms.BooleanField(
        label="Include its derivatives",
        required=False,
        help_text="Quantizations, conversions and fine-tunes we track whose model card names "
        "it as their base, at every level.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.chosen_target = _chosen(self, "target", TARGET_FIELDS, SubscriptionTarget.MODEL)
        optional = {"repo_id", "author", "rule", "with_derivatives", *EVENT_FIELDS}
        _keep_only(self, TARGET_FIELDS[self.chosen_target], optional)
        _require(self, "repo_id", "Enter the model's repo id, as owner/name.")
        _require(self, "author", "Enter a Hub user or organisation name.")
        _require(self, "rule", "Pick a rule.")
        channels = Channel.objects.owned_by(user).filter(disabled_at__isnull=True)
        self.fields["channel"].queryset = channels  # type: ignore[attr-defined]
        # The newest of the reader's own channels: most often the one just added for this. Not
        # a team's: anyone in a team can add a channel to it, and a subscription defaulted to
        # it would send what the reader follows to someone else's address.
        newest = channels.filter(owner=user, team__isnull=True).order_by("-created_at", "-pk")
        if (first := newest.first()) is not None and "channel" not in self.initial:
            self.initial["channel"] = first.pk

    @property
    def event_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in EVENT_FIELDS if name in self.fields]

    @property
    def target_fields(self) -> list[forms.BoundField]:
        names = ("repo_id", "with_derivatives", "author", "rule")
        return [self[name] for name in names if name in self.fields]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        target = self.chosen_target
        if target == SubscriptionTarget.MODEL and data.get("repo_id"):
            try:
                repo_id = validate_repo_id(data.get("repo_id") or "")
            except ValidationError as err:
                self.add_error("repo_id", err.messages[0])
                return data
            data["model"] = HubModel.objects.filter(repo_id__iexact=repo_id).first()
            if data["model"] is None:
                self.add_error("repo_id", f"{repo_id} is not tracked yet: track it first.")
        elif target == SubscriptionTarget.AUTHOR and not AUTHOR_RE.match(data.get("author", "x")):
            self.add_error("author", "Enter a Hub user or organisation name.")
        if target != SubscriptionTarget.RULE and not any(data.get(f) for f in EVENT_FIELDS):
            self.add_error(None, "Pick at least one kind of event.")
        return data

    def save(self) -> tuple[Subscription, bool]:
        """The subscription, and whether it is new. The same target on the same channel again
        is the same subscription with the events now chosen: one alert per event, not one per
        time the form was sent."""
        data = self.cleaned_data
        target = data["target"]
        return Subscription.objects.update_or_create(
            user=self.user,
            channel=data["channel"],
            target=target,
            model=data.get("model") if target == SubscriptionTarget.MODEL else None,
            author=data["author"] if target == SubscriptionTarget.AUTHOR else "",
            rule=data["rule"] if target == SubscriptionTarget.RULE else "",
            defaults={
                # A rule is about verdicts only: it has no event fields of its own.
                "on_template": data.get("on_template", False),
                "on_verdict": data.get("on_verdict", False) or target == SubscriptionTarget.RULE,
                "on_probe": data.get("on_probe", False),
                "on_status": data.get("on_status", False),
                "on_base_fixed": data.get("on_base_fixed", False)
                or target == SubscriptionTarget.RULE,
                "with_derivatives": bool(data.get("with_derivatives"))
                and target == SubscriptionTarget.MODEL,
            },
        )


class TeamForm(forms.ModelForm):  # type: ignore[type-arg]
    """On the settings page beside the channel form, which has a `name` too: ids of its own,
    so each label names its own field."""

    class Meta:
        model = Team
        fields = ["name"]
        labels = {"name": "Team name"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "id_team_%s")
        super().__init__(*args, **kwargs)


class MemberForm(forms.Form):
    """Whom to invite to a team (docs/alerts.md: nobody joins a team without accepting)."""

    email = forms.EmailField(label="Email address to invite", max_length=254)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "id_member_%s")
        super().__init__(*args, **kwargs)


class SigninLinkForm(forms.Form):
    #: 254: what an address can be (RFC 5321's path limit) and what the account's column holds.
    email = forms.EmailField(label="Email address", max_length=254)
