"""Alert URLs, mounted under /alerts/."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

app_name = "alerts"
urlpatterns = [
    path("", views.settings_page, name="settings"),
    path("channels/new", views.channel_create, name="channel_create"),
    path("channels/form", views.channel_form, name="channel_form"),
    path("subscriptions/form", views.subscription_form, name="subscription_form"),
    path("channels/<int:pk>/", views.channel_detail, name="channel"),
    path("channels/<int:pk>/test", views.channel_test, name="channel_test"),
    path(
        "channels/<int:pk>/confirmation",
        views.channel_resend_confirmation,
        name="channel_resend_confirmation",
    ),
    path("channels/<int:pk>/delete", views.channel_delete, name="channel_delete"),
    path("subscriptions/new", views.subscription_create, name="subscription_create"),
    path("subscriptions/<int:pk>/delete", views.subscription_delete, name="subscription_delete"),
    path("teams/new", views.team_create, name="team_create"),
    path("teams/<int:pk>/members", views.team_add_member, name="team_add_member"),
    path("teams/<int:pk>/leave", views.team_leave, name="team_leave"),
    path("teams/join/<str:token>/", views.team_join, name="team_join"),
    path("confirm/<str:token>/", views.confirm, name="confirm"),
    path("unsubscribe/<str:token>/", views.unsubscribe, name="unsubscribe"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("login/link/", views.signin_request, name="signin_request"),
    path("login/link/<str:token>/", views.signin_link, name="signin_link"),
    path("password/", views.PasswordView.as_view(), name="password"),
    path("logout/", auth_views.LogoutView.as_view(next_page="alerts:login"), name="logout"),
]
