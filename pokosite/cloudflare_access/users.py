"""Service: an Access identity becomes a Django user.

A person is the user named by their email, created on first visit with no usable password (they
sign in through Access, never with a Django password). Staff and superuser come from the
allow-lists in settings (CF_ACCESS_STAFF_EMAILS / _GROUPS, CF_ACCESS_SUPERUSER_EMAILS / _GROUPS)
and are set again on every visit, so taking someone off a list takes their rights away; nothing
in the token itself can grant them. A service token is the user `service-token:<common_name>`,
never staff; the gate keeps it to the API paths.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser

from pokosite.cloudflare_access.config import AccessConfig
from pokosite.cloudflare_access.tokens import AccessDenied, AccessIdentity

SERVICE_USERNAME_PREFIX = "service-token:"


def access_rights(*, identity: AccessIdentity, config: AccessConfig) -> tuple[bool, bool]:
    """(is_staff, is_superuser) for this identity under the allow-lists."""
    if identity.is_service:
        return False, False
    groups = {g.casefold() for g in identity.groups}
    is_superuser = identity.email in config.superuser_emails or bool(
        groups & config.superuser_groups
    )
    is_staff = (
        is_superuser or identity.email in config.staff_emails or bool(groups & config.staff_groups)
    )
    return is_staff, is_superuser


def access_username(identity: AccessIdentity) -> str:
    if identity.is_service:
        return SERVICE_USERNAME_PREFIX + (identity.common_name or "")
    return identity.email or ""


def access_user_sync(*, identity: AccessIdentity, config: AccessConfig) -> AbstractBaseUser:
    """The user for this identity, created if new, with staff/superuser as the lists say."""
    user_model = get_user_model()
    username = access_username(identity)
    max_length = user_model._meta.get_field(user_model.USERNAME_FIELD).max_length or 150
    if len(username) > max_length:
        raise AccessDenied(f"identity longer than {max_length} characters")
    is_staff, is_superuser = access_rights(identity=identity, config=config)
    user, created = user_model._default_manager.get_or_create(
        **{user_model.USERNAME_FIELD: username},
        defaults={
            "email": identity.email or "",
            "is_staff": is_staff,
            "is_superuser": is_superuser,
        },
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    elif (user.is_staff, user.is_superuser) != (is_staff, is_superuser):
        user.is_staff, user.is_superuser = is_staff, is_superuser
        user.save(update_fields=["is_staff", "is_superuser"])
    return user
