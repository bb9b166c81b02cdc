"""Forms of the alert pages; each one that picks a channel offers only the user's own."""

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
            "address": "Email address",
            "url": "Webhook URL",
            "digest": "Send one digest a day instead of one message per event",
        }

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(members=user)  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if kind == ChannelKind.EMAIL:
            if not data.get("address"):
                self.add_error("address", "An email channel needs an address.")
            data["url"] = ""
        elif kind:
            url = data.get("url")
            if not url:
                self.add_error("url", "A webhook channel needs its URL.")
            elif kind_of_address := outbound.literal_refusal(url):
                # Only a courtesy: the client checks every address again at send time, after DNS.
                self.add_error("url", f"Webhooks cannot go to a {kind_of_address} address.")
            data["address"] = ""
        return data


class SubscriptionForm(forms.Form):
    target = forms.ChoiceField(label="Subscribe to", choices=SubscriptionTarget.choices)
    repo_id = forms.CharField(label="Model (owner/name)", max_length=300, required=False)
    author = forms.CharField(label="Author or organisation", max_length=100, required=False)
    rule = forms.ChoiceField(label="Rule", choices=[("", "—"), *Rule.choices], required=False)
    channel = forms.ModelChoiceField(label="Send to", queryset=Channel.objects.none())
    on_template = forms.BooleanField(label="Template changed", required=False, initial=True)
    on_verdict = forms.BooleanField(label="Verdict changed", required=False, initial=True)
    on_probe = forms.BooleanField(label="Probe result changed", required=False, initial=True)
    on_status = forms.BooleanField(label="Repo gated or gone", required=False, initial=True)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        channels = Channel.objects.owned_by(user).filter(disabled_at__isnull=True)
        self.fields["channel"].queryset = channels  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        target = data.get("target")
        if target == SubscriptionTarget.MODEL:
            try:
                repo_id = validate_repo_id(data.get("repo_id") or "")
            except ValidationError as err:
                self.add_error("repo_id", err.messages[0])
                return data
            data["model"] = HubModel.objects.filter(repo_id__iexact=repo_id).first()
            if data["model"] is None:
                self.add_error("repo_id", f"{repo_id} is not tracked yet: track it first.")
        elif target == SubscriptionTarget.AUTHOR:
            if not AUTHOR_RE.match(data.get("author") or ""):
                self.add_error("author", "Enter a Hub user or organisation name.")
        elif target == SubscriptionTarget.RULE and not data.get("rule"):
            self.add_error("rule", "Pick a rule.")
        flags = ("on_template", "on_verdict", "on_probe", "on_status")
        if target != SubscriptionTarget.RULE and not any(data.get(f) for f in flags):
            self.add_error(None, "Pick at least one kind of event.")
        return data

    def save(self) -> Subscription:
        data = self.cleaned_data
        target = data["target"]
        return Subscription.objects.create(
            user=self.user,
            channel=data["channel"],
            target=target,
            model=data.get("model") if target == SubscriptionTarget.MODEL else None,
            author=data["author"] if target == SubscriptionTarget.AUTHOR else "",
            rule=data["rule"] if target == SubscriptionTarget.RULE else "",
            on_template=data["on_template"],
            on_verdict=data["on_verdict"] or target == SubscriptionTarget.RULE,
            on_probe=data["on_probe"],
            on_status=data["on_status"],
        )


class TeamForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Team
        fields = ["name"]
        labels = {"name": "Team name"}


class MemberForm(forms.Form):
    email = forms.EmailField(label="Member's email address")


class SigninLinkForm(forms.Form):
    email = forms.EmailField(label="Email address")
