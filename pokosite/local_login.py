"""How to log in to the town `make run` brought up, for the launcher to print.

On the first start (no superuser yet) it makes one for this machine, `admin` with a generated
password, and says the password once: only its hash is stored. On later starts it names the
superuser and the command that sets a new password. Only the launcher calls it, and only where
settings.LAUNCHER_CREATES_SUPERUSER is on (the base settings; production turns it off) and
Cloudflare Access is off (under Access, users come from its tokens, not passwords).
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model

from pokosite.cloudflare_access.config import access_is_enabled

USERNAME = "admin"
MANAGE = ".venv/bin/python manage.py"


def local_superuser_create() -> tuple[str, str] | None:
    """(username, password) of a superuser made now, or None when one exists already, the
    settings do not allow it, or the username is taken by an ordinary user."""
    if not getattr(settings, "LAUNCHER_CREATES_SUPERUSER", False) or access_is_enabled():
        return None
    users = get_user_model().objects
    if users.filter(is_superuser=True).exists() or users.filter(username=USERNAME).exists():
        return None
    password = secrets.token_urlsafe(12)
    users.create_superuser(username=USERNAME, email="", password=password)
    return USERNAME, password


def login_lines(admin_url: str, created: tuple[str, str] | None) -> list[str]:
    """What the launcher prints about logging in, after `local_superuser_create()`."""
    if access_is_enabled():
        return [f"log in at {admin_url} through Cloudflare Access (docs/deploy.md)"]
    token = f"API token: {MANAGE} drf_create_token <username>  (README: 'The API from a script')"
    if created is not None:
        username, password = created
        return [
            f"log in at {admin_url} as {username}, password {password}",
            "  (a superuser made for this machine; the password is shown only this once: "
            f"`{MANAGE} changepassword {username}` sets another)",
            token.replace("<username>", username),
        ]
    superuser = (
        get_user_model()
        .objects.filter(is_superuser=True, is_active=True)
        .order_by("pk")
        .values_list("username", flat=True)
        .first()
    )
    if superuser is None:
        return [f"to log in at {admin_url}, make a superuser: {MANAGE} createsuperuser", token]
    return [
        f"log in at {admin_url} as {superuser} (password forgotten? "
        f"{MANAGE} changepassword {superuser})",
        token.replace("<username>", superuser),
    ]
