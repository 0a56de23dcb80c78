"""What `make run` says about logging in (pokosite/local_login.py): a superuser made on the first
start, its password said once and stored only hashed; never in production or under Access."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model

from pokosite.local_login import USERNAME, local_superuser_create, login_lines

pytestmark = pytest.mark.django_db

ADMIN_URL = "http://127.0.0.1:8000/admin/"


def test_the_first_start_makes_a_superuser_and_says_its_password_once():
    created = local_superuser_create()
    assert created is not None
    username, password = created
    assert username == USERNAME and len(password) >= 16
    user = get_user_model().objects.get(username=username)
    assert user.is_superuser and user.is_staff and user.is_active
    assert password not in user.password  # only its hash is kept
    assert authenticate(username=username, password=password) == user
    lines = login_lines(ADMIN_URL, created)
    assert lines[0] == f"log in at {ADMIN_URL} as admin, password {password}"
    assert any("drf_create_token admin" in line for line in lines)
    # The next start makes none and no longer knows the password.
    assert local_superuser_create() is None
    again = "\n".join(login_lines(ADMIN_URL, None))
    assert password not in again
    assert "as admin (password forgotten? .venv/bin/python manage.py changepassword admin)" in again
    assert get_user_model().objects.count() == 1


def test_an_existing_superuser_is_named_and_none_is_made(django_user_model):
    django_user_model.objects.create_superuser("rin", password="pw-of-rin")
    assert local_superuser_create() is None
    assert login_lines(ADMIN_URL, None)[0].startswith(f"log in at {ADMIN_URL} as rin ")
    assert not django_user_model.objects.filter(username=USERNAME).exists()


def test_an_ordinary_admin_user_is_left_alone_and_createsuperuser_is_suggested(
    django_user_model,
):
    django_user_model.objects.create_user(USERNAME, password="ordinary")
    assert local_superuser_create() is None
    lines = login_lines(ADMIN_URL, None)
    assert lines[0].endswith("make a superuser: .venv/bin/python manage.py createsuperuser")
    assert not django_user_model.objects.filter(is_superuser=True).exists()


def test_never_where_the_settings_say_no(settings, django_user_model):
    settings.LAUNCHER_CREATES_SUPERUSER = False  # as pokosite.settings.production has it
    assert local_superuser_create() is None
    assert not django_user_model.objects.exists()
    assert "createsuperuser" in login_lines(ADMIN_URL, None)[0]


def test_never_under_cloudflare_access(settings, django_user_model):
    settings.CF_ACCESS_TEAM_DOMAIN = "pokotest.cloudflareaccess.com"
    settings.CF_ACCESS_AUD = "aud"
    assert local_superuser_create() is None
    assert not django_user_model.objects.exists()
    assert login_lines(ADMIN_URL, None) == [
        f"log in at {ADMIN_URL} through Cloudflare Access (docs/deploy.md)"
    ]
