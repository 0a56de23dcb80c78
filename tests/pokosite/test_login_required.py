"""Production without Cloudflare Access (POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS=true): nothing
answers an anonymous caller but /healthz and the login page; a session or a DRF token gets in.
(That production refuses to start without Access unless told: test_settings.py.)"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db

PROTECTED = ["/v1/models", "/metrics", "/api/runs/", "/api/towns/", "/", "/admin/"]


@pytest.fixture
def no_access_login(settings):
    settings.LOGIN_REQUIRED_WITHOUT_ACCESS = True
    settings.CF_ACCESS_TEAM_DOMAIN = settings.CF_ACCESS_AUD = ""


@pytest.mark.parametrize("path", PROTECTED)
def test_an_anonymous_caller_reaches_nothing(client, no_access_login, path):
    response = client.get(path)
    if path == "/v1/models":
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert "login required" in response.json()["error"]["message"]
    elif path.startswith("/api/"):
        assert response.status_code == 401 and "login required" in response.json()["detail"]
    elif path == "/metrics":
        assert response.status_code == 401 and b"login required" in response.content
    else:
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_health_check_and_the_login_page_stay_open(client, no_access_login):
    assert client.get("/healthz").status_code == 200
    assert client.get("/admin/login/").status_code == 200


def test_a_session_or_a_token_gets_in(client, no_access_login):
    user = get_user_model().objects.create_user("rin", password="pw")
    key = Token.objects.create(user=user).key
    for scheme in ("Bearer", "Token"):
        headers = {"Authorization": f"{scheme} {key}"}
        assert client.get("/v1/models", headers=headers).status_code == 200
        assert client.get("/api/runs/", headers=headers).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    user.is_active = False
    user.save()
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    client.force_login(get_user_model().objects.create_user("kenji", password="pw"))
    assert client.get("/metrics").status_code == 200


def test_off_by_default_for_local_use(client):
    assert client.get("/v1/models").status_code == 200  # make run on 127.0.0.1: no login
