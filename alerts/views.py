"""Alert pages: settings, channels, subscriptions, teams, confirm / unsubscribe / sign-in links.

Thin: fetch what the user owns or 404, one or two calls, render or redirect. Every
change is a POST behind CSRF; the one exception is the RFC 8058 one-click unsubscribe, which
mail providers POST without a cookie: its signed token is the proof.
"""

from __future__ import annotations

import logging
import smtplib
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.contrib.auth.views import redirect_to_login
from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from . import delivery, emails, throttles, tokens
from .addresses import mailbox
from .forms import ChannelForm, MemberForm, SigninLinkForm, SubscriptionForm, TeamForm
from .models import Channel, Subscription, Team, TeamInvitation

logger = logging.getLogger(__name__)

RECENT_DELIVERIES = 25


def _mailed(request: HttpRequest, message: EmailMultiAlternatives) -> bool:
    """Send a mail now; on a mail server failure say so on the next page instead of a 500."""
    try:
        message.send()
    except (smtplib.SMTPException, OSError) as exc:
        logger.warning("could not send %r: %s", message.subject, exc)
        messages.error(request, "The mail could not be sent just now; please try again later.")
        return False
    return True


def _limited(request: HttpRequest, what: str) -> HttpResponse:
    return render(
        request, "alerts/message.html", {"title": "Too many requests", "text": what}, status=429
    )


def safe_next(request: HttpRequest, value: str | None) -> str | None:
    """A page of this site to go back to, from a `next` field; None for anything else."""
    if not value or not value.startswith("/"):
        return None
    if url_has_allowed_host_and_scheme(value, allowed_hosts=None, require_https=False):
        return value
    return None


def _subscription_initial(query: Any) -> dict[str, str]:
    """What a link from a model or author page asks to subscribe to (`?repo_id=` / `?author=`)."""
    initial = {k: query[k] for k in ("repo_id", "author", "target") if query.get(k)}
    if "target" not in initial and ("repo_id" in initial or "author" in initial):
        initial["target"] = "model" if "repo_id" in initial else "author"
    return initial


def _return_to(request: HttpRequest) -> str:
    """This page with the model or author it was opened for, to come back to after a detour."""
    keep = {k: v for k, v in _subscription_initial(request.GET).items() if k != "target"}
    return reverse("alerts:settings") + (f"?{urlencode(keep)}" if keep else "")


def _settings_context(request: HttpRequest, **forms: Any) -> dict[str, Any]:
    user: Any = request.user  # signed in: every view using this is login_required
    initial = _subscription_initial(request.GET)
    return {
        "channels": Channel.objects.owned_by(user).select_related("team"),
        "subscriptions": Subscription.objects.filter(user=user).select_related("channel", "model"),
        "teams": Team.objects.filter(members=user).prefetch_related(
            Prefetch("members", queryset=get_user_model().objects.order_by("email"))
        ),
        "channel_form": forms.get("channel_form") or ChannelForm(user=user),
        "subscription_form": forms.get("subscription_form")
        or SubscriptionForm(user=user, initial=initial),
        "team_form": forms.get("team_form") or TeamForm(),
        "member_form": MemberForm(),
        "return_to": _return_to(request) if initial else "",
        "subscribing_to": initial.get("repo_id") or initial.get("author", ""),
    }


@login_required
@require_safe
def settings_page(request: HttpRequest) -> HttpResponse:
    """The user's subscriptions and channels, with each channel's delivery history."""
    return render(request, "alerts/settings.html", _settings_context(request))


@login_required
@require_safe
def channel_form(request: HttpRequest) -> HttpResponse:
    """The add-a-channel form for the kind in the query: htmx swaps it in when the kind changes."""
    form = ChannelForm(user=request.user, initial=request.GET.dict())
    context = {"channel_form": form, "return_to": safe_next(request, request.GET.get("next"))}
    return render(request, "alerts/_channel_form.html", context)


@login_required
@require_safe
def subscription_form(request: HttpRequest) -> HttpResponse:
    """The subscribe form for the target in the query (a model, an author, a rule)."""
    form = SubscriptionForm(user=request.user, initial=request.GET.dict())
    return render(request, "alerts/_subscription_form.html", {"subscription_form": form})


@login_required
@require_POST
def channel_create(request: HttpRequest) -> HttpResponse:
    form = ChannelForm(request.POST, user=request.user)
    back = safe_next(request, request.POST.get("next"))
    if not form.is_valid():
        context = _settings_context(request, channel_form=form)
        context["return_to"] = back or ""
        return render(request, "alerts/settings.html", context, status=400)
    channel: Channel = form.save(commit=False)
    if channel.team is None:
        channel.owner = request.user  # type: ignore[assignment]
    if channel.is_email:
        if not throttles.allowed("confirmation_mail", request, channel.address):
            return _limited(request, "Too many confirmation mails; try again in an hour.")
        channel.save()
        if _mailed(request, emails.confirmation_email(channel)):
            messages.info(request, f"We sent a confirmation link to {channel.address}.")
    else:
        channel.confirmed_at = timezone.now()
        channel.save()
    if back:  # opened to subscribe to something: back there, the new channel ready to pick
        messages.info(request, f"Channel added: {channel}. Now pick what to hear about.")
        return HttpResponseRedirect(back)
    return redirect("alerts:channel", pk=channel.pk)


def _owned_channel(request: HttpRequest, pk: int) -> Channel:
    return get_object_or_404(Channel.objects.owned_by(request.user), pk=pk)


@login_required
@require_safe
def channel_detail(request: HttpRequest, pk: int) -> HttpResponse:
    channel = _owned_channel(request, pk)
    deliveries = channel.deliveries.select_related("event__model")[:RECENT_DELIVERIES]
    return render(request, "alerts/channel.html", {"channel": channel, "deliveries": deliveries})


@login_required
@require_POST
def channel_test(request: HttpRequest, pk: int) -> HttpResponse:
    channel = _owned_channel(request, pk)
    if not channel.is_active:
        messages.error(request, "This channel is not active: confirm or re-create it first.")
        return redirect("alerts:channel", pk=channel.pk)
    if not throttles.allowed("test_send", request):
        return _limited(request, "Too many test sends; try again in an hour.")
    delivery.enqueue("send_test", channel.pk)
    # A test send is no event: it is not a delivery row, its outcome is the channel's own.
    messages.info(
        request,
        'Test message queued: in a few seconds its result shows here as "Last success" or '
        '"Last error" (reload the page).',
    )
    return redirect("alerts:channel", pk=channel.pk)


@login_required
@require_POST
def channel_resend_confirmation(request: HttpRequest, pk: int) -> HttpResponse:
    channel = _owned_channel(request, pk)
    if channel.is_email and channel.confirmed_at is None:
        if not throttles.allowed("confirmation_mail", request, channel.address):
            return _limited(request, "Too many confirmation mails; try again in an hour.")
        if _mailed(request, emails.confirmation_email(channel)):
            messages.info(request, f"We sent a new confirmation link to {channel.address}.")
    return redirect("alerts:channel", pk=channel.pk)


@login_required
@require_POST
def channel_delete(request: HttpRequest, pk: int) -> HttpResponse:
    _owned_channel(request, pk).delete()
    return redirect("alerts:settings")


@login_required
@require_POST
def subscription_create(request: HttpRequest) -> HttpResponse:
    if not throttles.allowed("subscribe", request):
        return _limited(request, "Too many subscriptions at once; try again in an hour.")
    form = SubscriptionForm(request.POST, user=request.user)
    if not form.is_valid():
        context = _settings_context(request, subscription_form=form)
        return render(request, "alerts/settings.html", context, status=400)
    subscription, created = form.save()
    if created:
        messages.info(request, f"Subscribed: {subscription.describe()}.")
    else:
        messages.info(
            request,
            f"Already subscribed: {subscription.describe()} on {subscription.channel}; "
            "it now sends the events you chose.",
        )
    return redirect("alerts:settings")


@login_required
@require_POST
def subscription_delete(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(Subscription, pk=pk, user=request.user).delete()
    return redirect("alerts:settings")


@login_required
@require_POST
def team_create(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST)
    if not form.is_valid():
        context = _settings_context(request, team_form=form)
        return render(request, "alerts/settings.html", context, status=400)
    team = form.save()
    team.members.add(request.user.pk)
    return redirect("alerts:settings")


@login_required
@require_POST
def team_add_member(request: HttpRequest, pk: int) -> HttpResponse:
    """Invite someone to the team by address: a mail with a link they accept, signed in with
    that address. Adding a member at once put anyone with an account into a team without a
    word from them, and its "no account has that address" told a stranger which addresses had
    one: the answer is now the same either way."""
    user: Any = request.user
    team = get_object_or_404(Team, pk=pk, members=user)
    form = MemberForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give one email address to invite.")
        return redirect("alerts:settings")
    address = form.cleaned_data["email"]
    members = team.members.exclude(email="").values_list("email", flat=True)
    if mailbox(address) in {mailbox(m) for m in members}:  # (its members are on this page)
        messages.info(request, f"{address} is already in {team.name}.")
        return redirect("alerts:settings")
    if not throttles.allowed("invite_mail", request, address):
        return _limited(request, "Too many invitations; try again in an hour.")
    invitation = TeamInvitation.objects.create(team=team, invited_by=user, address=address)
    if _mailed(request, emails.invite_email(invitation)):
        days = tokens.INVITE_MAX_AGE.days
        messages.info(request, f"Invitation sent to {address}. They join {team.name} when they "
                               f"accept it, within {days} days.")  # fmt: skip
    else:
        invitation.delete()
    return redirect("alerts:settings")


@require_http_methods(["GET", "POST"])
def team_join(request: HttpRequest, token: str) -> HttpResponse:
    """An invitation's link: GET asks, POST joins (a mail scanner joins nobody), once, and
    only for the owner of the address invited, signed in; anyone else is sent to sign in."""
    invitation = tokens.invitation(token)
    if invitation is None:
        return _bad_link(request)
    user: Any = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not tokens.is_invited(user, invitation.address):
        text = ("This invitation was sent to another address. Sign out, and sign in with the "
                "address it was sent to.")  # fmt: skip
        return render(request, "alerts/message.html",
                      {"title": "Not your invitation", "text": text}, status=403)  # fmt: skip
    team = invitation.team
    if request.method == "POST":
        try:
            with transaction.atomic():
                # The team's row, locked: its last member leaving deletes it (team_leave locks
                # it too); a join racing that answered 500, or left a membership of nothing.
                if not Team.objects.select_for_update().filter(pk=team.pk).exists():
                    return _bad_link(request)
                taken = TeamInvitation.objects.filter(
                    pk=invitation.pk, accepted_at__isnull=True
                ).update(accepted_at=timezone.now())
                if not taken:  # accepted meanwhile, or its sender left: it works once
                    return _bad_link(request)
                team.members.add(user)
        except IntegrityError:  # the team went as it was joined (SQLite locks no row)
            return _bad_link(request)
        messages.info(request, f"You joined {team.name}.")
        return redirect("alerts:settings")
    member = team.members.filter(pk=user.pk).exists()
    return render(request, "alerts/team_join.html",
                  {"team": team, "inviter": invitation.invited_by, "member": member})  # fmt: skip


@login_required
@require_POST
def team_leave(request: HttpRequest, pk: int) -> HttpResponse:
    user: Any = request.user
    team = get_object_or_404(Team, pk=pk, members=user)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).exists()  # (see team_join)
        team.members.remove(user)
        # What the leaver follows on the team's channels stops there: it kept sending to the
        # team, and its members saw it (`Subscription.objects.matching` also checks).
        Subscription.objects.filter(user=user, channel__team=team).delete()
        # And the invitations they sent: back in the team later, they bring none back.
        TeamInvitation.objects.filter(team=team, invited_by=user).delete()
        if not team.members.exists():
            team.delete()  # nobody left to own its channels
    return redirect("alerts:settings")


@require_http_methods(["GET", "POST"])
def confirm(request: HttpRequest, token: str) -> HttpResponse:
    """GET asks, POST confirms: a mail scanner following the link confirms nothing."""
    channel = tokens.channel_to_confirm(token)
    if channel is None:
        return _bad_link(request)
    if request.method == "POST":
        Channel.objects.filter(pk=channel.pk, confirmed_at__isnull=True).update(
            confirmed_at=timezone.now()
        )
        return render(request, "alerts/message.html", {"title": "Address confirmed",
                      "text": f"Alerts will be sent to {channel.address}."})  # fmt: skip
    return render(request, "alerts/confirm.html", {"channel": channel})


@csrf_exempt  # RFC 8058 one-click POSTs come without a cookie; the signed token authorizes.
@require_http_methods(["GET", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    """GET shows a confirm form (scanners follow links); POST stops mail to the address."""
    channel = tokens.channel_to_unsubscribe(token)
    if channel is None:
        return _bad_link(request)
    if request.method == "POST":
        channel.disable("unsubscribed by a link in a mail")
        return render(request, "alerts/message.html", {"title": "Unsubscribed",
                      "text": f"No more alerts will be sent to {channel.address}."})  # fmt: skip
    return render(request, "alerts/unsubscribe.html", {"channel": channel})


def _bad_link(request: HttpRequest) -> HttpResponse:
    text = "This link has expired, was already used, or is not ours. Ask for a new one."
    return render(request, "alerts/message.html", {"title": "Link not valid", "text": text},
                  status=400)  # fmt: skip


class LoginView(auth_views.LoginView):
    """Sign in by password, with the emailed-link form beside it."""

    template_name = "alerts/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "link_form": SigninLinkForm()}

    def get_success_url(self) -> str:
        # A signed-in reader sent to this page with itself as `next` (anyone can link that)
        # went to Django's "redirection loop" error: a 500.
        url = str(super().get_success_url())
        return reverse("alerts:settings") if url == self.request.path else url

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Password guesses are counted as mails are, per client, per account asked for."""
        username = str(request.POST.get("username", ""))[:254]
        if not throttles.allowed("password_signin", request, username):
            return _limited(request, "Too many sign-in attempts; try again in an hour.")
        return super().post(request, *args, **kwargs)


class PasswordView(auth_views.PasswordChangeView):
    """Set a password (accounts made by a sign-in link have none) or change it."""

    template_name = "alerts/password.html"
    success_url = reverse_lazy("alerts:settings")

    def get_form_class(self) -> Any:
        user: Any = self.request.user
        return PasswordChangeForm if user.has_usable_password() else SetPasswordForm

    def form_valid(self, form: Any) -> HttpResponse:
        messages.info(self.request, "Password saved.")
        return super().form_valid(form)


@require_POST
def signin_request(request: HttpRequest) -> HttpResponse:
    """Mail a one-time sign-in link (an account is created on its first use)."""
    form = SigninLinkForm(request.POST)
    back = safe_next(request, request.POST.get("next"))
    if not form.is_valid():
        context = {"link_form": form, "next": back or ""}
        return render(request, "alerts/login.html", context, status=400)
    address = form.cleaned_data["email"]
    if not throttles.allowed("signin_mail", request, address):
        return _limited(request, "Too many sign-in mails; try again in an hour.")
    if not _mailed(request, emails.signin_email(address, back)):
        text = "The mail could not be sent just now; please try again in a few minutes."
        return render(request, "alerts/message.html", {"title": "Not sent", "text": text},
                      status=503)  # fmt: skip
    text = f"We sent a sign-in link to {address}. It works once, for 15 minutes."
    return render(request, "alerts/message.html", {"title": "Check your mail", "text": text})


@require_http_methods(["GET", "POST"])
def signin_link(request: HttpRequest, token: str) -> HttpResponse:
    """GET asks, POST signs in: a scanner cannot use up the single-use link."""
    back = safe_next(request, request.GET.get("next"))
    if request.method == "GET":
        if tokens.signin_address(token) is None:
            return _bad_link(request)
        return render(request, "alerts/signin_link.html", {"token": token, "next": back or ""})
    user = tokens.user_to_sign_in(token)
    if user is None:
        return _bad_link(request)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponseRedirect(back or reverse("alerts:settings"))
