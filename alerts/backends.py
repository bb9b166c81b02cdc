"""Password sign-in by the address an account was made with.

Accounts are made by a mailed link, with the address as their username when it fits Django's
150-character column, and a shortened form with a hash past that (`tokens.username_for`): an
address of 180 characters, or one typed in another case, could never sign in by password,
as no page shows the stored username. This backend also takes the address, compared as the
rest of alerts compares them (`alerts.addresses.mailbox`: ASCII case only, so a look-alike
letter is another account).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest

from .addresses import mailbox


class AddressBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if not username or "@" not in username or password is None:
            return None
        wanted = mailbox(username)
        for user in get_user_model().objects.filter(email__iexact=username).order_by("pk"):
            if mailbox(user.email) == wanted:
                if user.check_password(password) and self.user_can_authenticate(user):
                    return user
                return None
        return None
