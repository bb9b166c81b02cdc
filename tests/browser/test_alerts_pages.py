"""The alert pages in Chromium: sign in, add a channel, subscribe; unsubscribe from a mail link."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from alerts import tokens
from alerts.models import Channel, ChannelKind, Subscription
from tests.browser.conftest import screenshot
from tests.test_alerts_support import make_channel, make_model, make_user

# The browser fixtures (one Chromium for the whole run) come from tests/browser/conftest.py.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "a long enough password 1"


def test_sign_in_add_a_webhook_and_subscribe_to_a_model(page: Any, live_server: Any) -> None:
    make_user("alice", password=PASSWORD)
    make_model("Qwen/Qwen3-0.6B")
    page.goto(live_server.url + "/alerts/?repo_id=Qwen/Qwen3-0.6B")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_role("heading", name="Alerts")).to_be_visible()

    page.get_by_label("Kind").select_option("slack")
    page.get_by_label("Webhook URL").fill("https://hooks.slack.com/services/T0/B0/secret")
    page.get_by_role("button", name="Add channel").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(
        "Slack incoming webhook https://hooks.slack.com/…"  # the path is a secret: not shown
    )
    page.get_by_role("link", name="← All alerts").click()
    expect(page.get_by_role("cell", name="Active")).to_be_visible()

    # A "subscribe" link from a model page fills the model in.
    page.goto(live_server.url + "/alerts/?repo_id=Qwen/Qwen3-0.6B")
    expect(page.get_by_label("Model (owner/name)")).to_have_value("Qwen/Qwen3-0.6B")
    page.get_by_label("Send to").select_option(
        label="Slack incoming webhook https://hooks.slack.com/…"
    )
    page.get_by_label("Probe result changed").uncheck()
    page.get_by_role("button", name="Subscribe").click()
    expect(page.get_by_text("Subscribed: Qwen/Qwen3-0.6B.")).to_be_visible()
    row = page.locator("tr", has_text="Qwen/Qwen3-0.6B")
    expect(row).to_contain_text("Template changed, Verdict changed, Repo gated or gone")
    sub = Subscription.objects.get()
    assert sub.model is not None
    assert (sub.model.repo_id, sub.on_probe, sub.channel.kind) == ("Qwen/Qwen3-0.6B", False,
                                                                   ChannelKind.SLACK)  # fmt: skip
    screenshot(page, "alerts-settings")


def test_unsubscribing_from_a_mail_link_asks_first(page: Any, live_server: Any) -> None:
    channel = make_channel(make_user("alice"), ChannelKind.EMAIL, "alice@example.com")
    page.goto(f"{live_server.url}/alerts/unsubscribe/{tokens.unsubscribe_token(channel)}/")
    expect(page.get_by_text("Stop sending CacheSafe alerts to alice@example.com?")).to_be_visible()
    assert Channel.objects.get().disabled_at is None
    screenshot(page, "alerts-unsubscribe")
    page.get_by_role("button", name="Unsubscribe").click()
    expect(page.get_by_role("heading", name="Unsubscribed")).to_be_visible()
    assert Channel.objects.get().disabled_at is not None
