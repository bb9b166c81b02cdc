"""The alert pages in Chromium: sign in, add a channel, subscribe; unsubscribe from a mail link."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from alerts import tokens
from alerts.models import Channel, ChannelKind, Subscription
from tests.browser.conftest import htmx_idle, screenshot, screenshots_at_widths
from tests.dashboard_data import add_model
from tests.test_alerts_support import make_channel, make_model, make_user, own_cache

# The browser fixtures (one Chromium for the whole run) come from tests/browser/conftest.py.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["own_cache"]  # a fixture: rate-limit counters start at zero

PASSWORD = "a long enough password 1"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_from_a_model_page_through_sign_in_to_a_subscription(
    page: Any, live_server: Any, mailoutbox: list[Any], own_cache: Any
) -> None:
    """A first-time reader: "get alerts" on a model page, a sign-in link by mail, a Slack
    channel (the form shows the URL field, not the address one), and back to subscribe."""
    add_model("Qwen/Qwen3-0.6B", CHATML, commit="a1" * 20, check=False)
    page.goto(live_server.url + "/m/Qwen/Qwen3-0.6B/")
    page.get_by_role("link", name="Get alerts when this template changes").click()
    expect(page.get_by_role("heading", name="Sign in", exact=True)).to_be_visible()
    screenshots_at_widths(page, "alerts-sign-in")
    page.get_by_label("Email address").fill("new@example.com")
    page.get_by_role("button", name="Mail me a link").click()
    expect(page.get_by_role("heading", name="Check your mail")).to_be_visible()
    link = re.search(r"https?://\S+/alerts/login/link/\S+", mailoutbox[0].body)
    assert link, mailoutbox[0].body
    page.goto(live_server.url + "/alerts/" + link.group(0).split("/alerts/", 1)[1])
    page.get_by_role("button", name="Sign in to CacheSafe").click()

    # Back on the alerts page, for the model the reader came from.
    first = page.get_by_text("To get alerts about Qwen/Qwen3-0.6B, first add a channel")
    expect(first).to_be_visible()
    form = page.locator("#channel-form")
    expect(form.get_by_label("Email address")).to_be_visible()
    expect(form.get_by_label("Webhook URL")).to_have_count(0)
    form.get_by_label("Send alerts by").select_option("slack")
    expect(form.get_by_label("Webhook URL")).to_be_visible()  # swapped in by htmx
    expect(form.get_by_label("Email address")).to_have_count(0)
    htmx_idle(page)
    screenshots_at_widths(page, "alerts-first-channel")
    form.get_by_label("Webhook URL").fill("https://hooks.slack.com/services/T0/B0/secret")
    form.get_by_role("button", name="Add channel").click()

    expect(page.get_by_text("Channel added")).to_be_visible()
    sub_form = page.locator("#subscription-form")
    expect(sub_form.get_by_label("Model (owner/name)")).to_have_value("Qwen/Qwen3-0.6B")
    # A refused id is echoed in the field's error, one long word: it wraps.
    sub_form.get_by_label("Model (owner/name)").fill("acme/" + "m" * 250)
    sub_form.get_by_role("button", name="Subscribe").click()
    expect(sub_form.locator(".field-error")).to_contain_text(
        "250 characters in one part, at most 96"
    )
    screenshots_at_widths(page, "alerts-refused-id")
    sub_form.get_by_label("Model (owner/name)").fill("Qwen/Qwen3-0.6B")
    sub_form.get_by_label("Send to").select_option(
        label="Slack incoming webhook https://hooks.slack.com/…"  # the path is a secret: not shown
    )
    sub_form.get_by_label("Probe result changed").uncheck()
    sub_form.get_by_role("button", name="Subscribe").click()
    expect(page.get_by_text("Subscribed: Qwen/Qwen3-0.6B.")).to_be_visible()
    item = page.locator("li.item", has_text="Qwen/Qwen3-0.6B")
    expect(item).to_contain_text("Template changed, Verdict changed, Repo gated or gone")
    channels = page.locator("section[aria-labelledby=channels-title] li.item")
    expect(channels.filter(has_text="Slack incoming webhook")).to_contain_text("Active")
    sub = Subscription.objects.get()
    assert sub.model is not None
    assert (sub.model.repo_id, sub.on_probe, sub.channel.kind) == ("Qwen/Qwen3-0.6B", False,
                                                                   ChannelKind.SLACK)  # fmt: skip

    # A rule has no event boxes; an author has an author field instead of a model.
    sub_form.get_by_label("Subscribe to").select_option("rule")
    expect(sub_form.get_by_label("Rule")).to_be_visible()
    expect(sub_form.get_by_text("Tell me when")).to_have_count(0)
    htmx_idle(page)  # as a person would: the swapped-in select is bound ~20 ms after it shows
    sub_form.get_by_label("Subscribe to").select_option("author")
    expect(sub_form.get_by_label("Author or organisation")).to_be_visible()
    expect(sub_form.get_by_label("Model (owner/name)")).to_have_count(0)
    screenshots_at_widths(page, "alerts-settings")

    channels.first.get_by_role("link").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(
        "Slack incoming webhook https://hooks.slack.com/…"
    )
    expect(page.get_by_role("button", name="Send a test message")).to_be_visible()
    screenshots_at_widths(page, "alerts-channel")


def test_a_password_sign_in_keeps_the_model_too(page: Any, live_server: Any) -> None:
    make_user("alice", password=PASSWORD)
    make_model("Qwen/Qwen3-0.6B")
    page.goto(live_server.url + "/alerts/?repo_id=Qwen/Qwen3-0.6B")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_text("To get alerts about Qwen/Qwen3-0.6B")).to_be_visible()


def test_unsubscribing_from_a_mail_link_asks_first(page: Any, live_server: Any) -> None:
    channel = make_channel(make_user("alice"), ChannelKind.EMAIL, "alice@example.com")
    page.goto(f"{live_server.url}/alerts/unsubscribe/{tokens.unsubscribe_token(channel)}/")
    expect(page.get_by_text("Stop sending CacheSafe alerts to alice@example.com?")).to_be_visible()
    assert Channel.objects.get().disabled_at is None
    screenshot(page, "alerts-unsubscribe")
    page.get_by_role("button", name="Unsubscribe").click()
    expect(page.get_by_role("heading", name="Unsubscribed")).to_be_visible()
    assert Channel.objects.get().disabled_at is not None
