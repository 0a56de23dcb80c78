"""Cloudflare Access, end to end: tokens signed with RSA keys made here, the team's JWKS served
by a real HTTP server on 127.0.0.1, requests through Django's full middleware stack (pages, the
DRF API), WebSocket connects through the Channels stack (a minimal consumer, and the project's
own pokosite.asgi.application)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.template.loader import render_to_string
from django.test import Client, RequestFactory
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

# Imported here, not in a test: it sets Django up again, which resets the loggers' handlers.
from pokosite.asgi import application as asgi_application
from pokosite.cloudflare_access.config import access_config
from pokosite.cloudflare_access.middleware import CloudflareAccessMiddleware
from pokosite.cloudflare_access.tokens import verifier_for
from pokosite.cloudflare_access.websocket import CloudflareAccessWebSocketMiddleware
from tests.town.factories import small_town_factory
from town import services

pytestmark = pytest.mark.django_db

REPO_ROOT = Path(__file__).resolve().parents[2]
TEAM = "https://pokotest.cloudflareaccess.com"
AUD = "4714c1358e65fe4b408ad6d432a5f878f08194bdb4752441fd56faefa9b2b6f2"
CERTS_PATH = "/cdn-cgi/access/certs"


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY_A, KEY_B, KEY_ATTACKER = _rsa_key(), _rsa_key(), _rsa_key()


def _jwk(key: rsa.RSAPrivateKey, kid: str) -> dict:
    return {
        **jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True),
        "kid": kid,
        "alg": "RS256",
        "use": "sig",
    }


class JWKSServer:
    """The team's certs endpoint: serves `keys`, counts how often it was fetched."""

    def __init__(self):
        self.keys: list[dict] = []
        self.num_fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != CERTS_PATH:
                    self.send_error(404)
                    return
                server.num_fetches += 1
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{CERTS_PATH}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def jwks_server():
    server = JWKSServer()
    yield server
    server.close()


@pytest.fixture
def jwks(jwks_server):
    jwks_server.keys = [_jwk(KEY_A, "kid-a")]
    jwks_server.num_fetches = 0
    verifier_for.cache_clear()  # each test starts with an empty key set cache
    yield jwks_server
    verifier_for.cache_clear()


@pytest.fixture
def access_on(settings, jwks):
    settings.CF_ACCESS_TEAM_DOMAIN = "pokotest.cloudflareaccess.com"
    settings.CF_ACCESS_AUD = AUD
    settings.CF_ACCESS_CERTS_URL = jwks.url
    settings.CF_ACCESS_JWKS_COOLDOWN_S = 0
    settings.CF_ACCESS_LEEWAY_S = 30
    settings.CF_ACCESS_STAFF_EMAILS = ["staff@example.com"]
    settings.CF_ACCESS_SUPERUSER_EMAILS = ["Root@Example.com"]
    settings.CF_ACCESS_STAFF_GROUPS = ["town-editors"]
    settings.CF_ACCESS_SUPERUSER_GROUPS = ["town-admins"]
    return settings


@pytest.fixture
def refusals():
    """What the Access loggers wrote (the project's loggers do not propagate to caplog)."""
    records: list[logging.LogRecord] = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = ListHandler(level=logging.DEBUG)
    logger = logging.getLogger("pokosite.cloudflare_access")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def claims(**overrides) -> dict:
    now = int(time.time())
    base = {
        "aud": [AUD],
        "email": "alice@example.com",
        "exp": now + 600,
        "iat": now,
        "nbf": now,
        "iss": TEAM,
        "type": "app",
        "identity_nonce": "n0nce",
        "sub": "7335d417-61da-459d-899c-0a01c76a2f94",
        "country": "JP",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def token(key=KEY_A, kid="kid-a", **overrides) -> str:
    return jwt.encode(claims(**overrides), key, algorithm="RS256", headers={"kid": kid})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _handmade(header: dict, payload: dict, secret: bytes | None) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    if secret is None:
        return signing_input + "."
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def hs256_token() -> str:
    # The classic confusion: HMAC keyed with the team's public key, which anyone can fetch.
    public_pem = KEY_A.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _handmade({"alg": "HS256", "typ": "JWT", "kid": "kid-a"}, claims(), public_pem)


def none_token() -> str:
    return _handmade({"alg": "none", "typ": "JWT", "kid": "kid-a"}, claims(), None)


def get(client, url: str, tok: str | None = None, **extra):
    headers = {"Cf-Access-Jwt-Assertion": tok} if tok else {}
    return client.get(url, headers=headers, **extra)


def user_named(username: str):
    return get_user_model().objects.get(username=username)


# --- HTTP: what passes --------------------------------------------------------------------


def test_healthz_stays_open_without_a_token(client, access_on):
    assert get(client, "/healthz").status_code == 200


def test_a_good_token_passes_for_a_page_and_is_the_user(client, access_on):
    response = get(client, "/admin/", token(email="Staff@Example.com"))
    assert response.status_code == 200
    assert response.wsgi_request.user.username == "staff@example.com"
    assert response.wsgi_request.cf_access_identity.email == "staff@example.com"
    # Not staff: Access lets them through, and Django's admin sends them to its login page.
    response = get(client, "/admin/", token(email="bob@example.com"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_a_good_token_passes_for_the_api(client, access_on):
    tok = token()
    assert get(client, "/api/schema/", tok).status_code == 200
    response = get(client, "/api/towns/", tok)
    assert response.status_code == 200
    assert response.wsgi_request.user.username == "alice@example.com"


def test_the_cookie_carries_a_token_too(client, access_on):
    client.cookies["CF_Authorization"] = token()
    response = client.get("/admin/")
    assert response.status_code == 302  # passed Access; alice is not staff
    assert user_named("alice@example.com").email == "alice@example.com"


def test_a_first_visit_creates_the_user_without_a_password(client, access_on):
    assert get(client, "/api/schema/", token(email="new@example.com")).status_code == 200
    user = user_named("new@example.com")
    assert not user.has_usable_password()
    assert (user.is_staff, user.is_superuser) == (False, False)
    assert get(client, "/api/schema/", token(email="new@example.com")).status_code == 200
    assert get_user_model().objects.filter(email="new@example.com").count() == 1


def test_an_audience_list_passes_when_it_contains_ours(client, access_on):
    assert get(client, "/api/schema/", token(aud=["someone-else", AUD])).status_code == 200
    assert get(client, "/api/schema/", token(aud=AUD)).status_code == 200


def test_small_clock_skew_is_allowed(client, access_on):
    now = int(time.time())
    assert get(client, "/api/schema/", token(exp=now - 10)).status_code == 200
    assert get(client, "/api/schema/", token(nbf=now + 10, iat=now + 10)).status_code == 200


# --- HTTP: what is refused ----------------------------------------------------------------

BAD_TOKENS = {
    "bad signature": (lambda: token(key=KEY_ATTACKER), "bad signature"),
    "HS256": (hs256_token, "algorithm 'HS256' is not RS256"),
    "none": (none_token, "algorithm 'none' is not RS256"),
    "wrong aud": (lambda: token(aud=["another-application"]), "wrong audience"),
    "wrong iss": (lambda: token(iss="https://evil.cloudflareaccess.com"), "wrong issuer"),
    "expired": (lambda: token(exp=int(time.time()) - 120), "expired"),
    "not yet valid": (lambda: token(nbf=int(time.time()) + 120), "not yet valid"),
    "issued in the future": (lambda: token(iat=int(time.time()) + 120), "not yet valid"),
    "unknown kid": (lambda: token(key=KEY_ATTACKER, kid="kid-unknown"), "unknown key id"),
    "no kid": (lambda: jwt.encode(claims(), KEY_A, algorithm="RS256"), "no key id"),
    "malformed": (lambda: "not-a-jwt", "malformed"),
    "malformed parts": (lambda: "eyJhbGciOiJSUzI1NiJ9.%%%.%%%", "malformed"),
    "no exp": (lambda: token(exp=None), "no exp claim"),
    "no identity": (lambda: token(email=None), "no email or common_name claim"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
@pytest.mark.parametrize("url", ["/admin/", "/api/towns/"])
def test_a_bad_token_is_refused_with_403_and_a_logged_reason(
    client, access_on, refusals, case, url
):
    make, reason = BAD_TOKENS[case]
    tok = make()
    response = get(client, url, tok)
    assert response.status_code == 403
    assert "Cloudflare Access" in response.content.decode()
    messages = [r.getMessage() for r in refusals]
    assert any(m.endswith(f": {reason}") and url in m for m in messages), messages
    assert all(tok not in m for m in messages)
    assert not get_user_model().objects.filter(email="alice@example.com").exists()


def test_no_token_is_refused(client, access_on, refusals):
    assert get(client, "/admin/").status_code == 403
    assert get(client, "/api/towns/").status_code == 403
    assert get(client, "/healthz/").status_code == 403  # only /healthz itself is open
    assert [r.getMessage().rsplit(": ", 1)[1] for r in refusals] == ["no token"] * 3


def test_an_unknown_key_id_is_refused_after_one_refresh(client, access_on, jwks, refusals):
    assert get(client, "/api/schema/", token()).status_code == 200
    assert jwks.num_fetches == 1
    assert get(client, "/api/schema/", token(key=KEY_B, kid="kid-b")).status_code == 403
    assert jwks.num_fetches == 2  # the unknown kid made it look again, once
    assert refusals[-1].getMessage().endswith(": unknown key id")


def test_a_rotated_key_is_picked_up(client, access_on, jwks, refusals):
    assert get(client, "/api/schema/", token()).status_code == 200
    jwks.keys = [_jwk(KEY_B, "kid-b")]  # the team rotated: A withdrawn, B signs now
    assert get(client, "/api/schema/", token(key=KEY_B, kid="kid-b")).status_code == 200
    assert jwks.num_fetches == 2
    assert get(client, "/api/schema/", token()).status_code == 403
    assert refusals[-1].getMessage().endswith(": unknown key id")


def test_the_key_set_is_cached(client, access_on, jwks):
    for _ in range(3):
        assert get(client, "/api/schema/", token()).status_code == 200
    assert jwks.num_fetches == 1


def test_the_cooldown_bounds_refreshes_forced_by_unknown_key_ids(client, access_on, jwks):
    access_on.CF_ACCESS_JWKS_COOLDOWN_S = 3600
    assert get(client, "/api/schema/", token()).status_code == 200
    for n in range(3):
        assert get(client, "/api/schema/", token(kid=f"kid-junk-{n}")).status_code == 403
    assert jwks.num_fetches == 1


def test_keys_that_cannot_be_fetched_refuse_everything(client, access_on, refusals):
    access_on.CF_ACCESS_CERTS_URL = "http://127.0.0.1:9/cdn-cgi/access/certs"  # discard port
    assert get(client, "/api/schema/", token()).status_code == 403
    assert refusals[-1].getMessage().endswith(": keys unavailable")


def test_a_deactivated_user_is_refused(client, access_on, refusals):
    get_user_model().objects.create_user("alice@example.com", is_active=False)
    assert get(client, "/api/schema/", token()).status_code == 403
    assert refusals[-1].getMessage().endswith(": user is deactivated")


# --- who is staff -------------------------------------------------------------------------


def test_the_allow_list_decides_staff_never_the_token(client, access_on):
    # Claims that look like rights grant nothing.
    get(client, "/admin/", token(email="bob@example.com", is_staff=True, groups=["admins"]))
    bob = user_named("bob@example.com")
    assert (bob.is_staff, bob.is_superuser) == (False, False)

    get(client, "/admin/", token(email="staff@example.com"))
    staff = user_named("staff@example.com")
    assert (staff.is_staff, staff.is_superuser) == (True, False)

    get(client, "/admin/", token(email="root@example.com"))
    root = user_named("root@example.com")
    assert (root.is_staff, root.is_superuser) == (True, True)


def test_access_groups_on_the_allow_list_grant_rights(client, access_on):
    get(client, "/admin/", token(email="ed@example.com", groups=["town-editors"]))
    assert user_named("ed@example.com").is_staff
    # Access's get-identity shape: objects with id and name.
    group = {"id": "b6a1c3", "name": "town-admins", "email": "admins@example.com"}
    get(client, "/admin/", token(email="ann@example.com", groups=[group]))
    assert user_named("ann@example.com").is_superuser


def test_leaving_the_allow_list_takes_the_rights_away(client, access_on):
    assert get(client, "/admin/", token(email="staff@example.com")).status_code == 200
    access_on.CF_ACCESS_STAFF_EMAILS = []
    assert get(client, "/admin/", token(email="staff@example.com")).status_code == 302
    assert not user_named("staff@example.com").is_staff


# --- service tokens -----------------------------------------------------------------------


def service_token() -> str:
    return token(email=None, common_name="88bf3b6d86161464f6509f7219099e57.access", sub="")


def test_a_service_token_is_an_api_only_user(client, access_on, refusals):
    response = get(client, "/api/towns/", service_token())
    assert response.status_code == 200
    user = response.wsgi_request.user
    assert user.username == "service-token:88bf3b6d86161464f6509f7219099e57.access"
    assert (user.is_staff, user.is_superuser, user.has_usable_password()) == (False, False, False)
    assert get(client, "/admin/", service_token()).status_code == 403
    assert refusals[-1].getMessage().endswith(": service token outside the API")


def test_a_listed_service_token_asks_for_a_decision_without_csrf(access_on, redis_url):
    run = services.run_create(town=small_town_factory(), nodes=["local"])
    client = Client(enforce_csrf_checks=True)  # as a real server: curl sends no CSRF token

    def ask(resident):
        return client.post(
            "/api/decisions/",
            {"run": run.pk, "resident": resident.pk},
            content_type="application/json",
            headers={"Cf-Access-Jwt-Assertion": service_token()},
        )

    aki, ben = run.town.residents.order_by("id")[:2]
    access_on.CONTROL_SERVICE_TOKENS = ["someone-else.access"]
    refused = ask(aki)
    assert refused.status_code == 403 and "CONTROL_SERVICE_TOKENS" in refused.json()["detail"]
    access_on.CONTROL_SERVICE_TOKENS = ["88bf3b6d86161464f6509f7219099e57.access"]
    response = ask(ben)
    assert response.status_code == 202, response.content
    polled = client.get(
        response.json()["url"], headers={"Cf-Access-Jwt-Assertion": service_token()}
    )
    assert polled.status_code == 200 and polled.json()["resident"] == ben.pk


class WhoAmI(APIView):
    def get(self, request):
        return Response({"user": request.user.username, "auth": str(request.auth)})

    def post(self, request):
        return self.get(request)


def _through_the_middleware(method: str, tok: str):
    view = CloudflareAccessMiddleware(WhoAmI.as_view())
    make = getattr(RequestFactory(), method)
    request = make("/api/whoami/", headers={"Cf-Access-Jwt-Assertion": tok})
    response = view(request)
    response.render()
    return response


def test_drf_sees_the_access_user_and_asks_browsers_for_csrf(access_on):
    response = _through_the_middleware("get", token())
    assert response.status_code == 200
    assert json.loads(response.content) == {
        "user": "alice@example.com",
        "auth": "alice@example.com",
    }
    # A browser's cookie goes along on cross-site posts: without the CSRF token, refused.
    response = _through_the_middleware("post", token())
    assert response.status_code == 403
    assert "CSRF" in response.content.decode()
    # A service token is a machine client with its own credentials: no CSRF token needed.
    response = _through_the_middleware("post", service_token())
    assert response.status_code == 200
    assert json.loads(response.content)["user"].startswith("service-token:")


# --- WebSocket ----------------------------------------------------------------------------


class WhoAmIConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()
        user = self.scope.get("user")
        await self.send(text_data=getattr(user, "username", "") or "anonymous")


WS_APP = CloudflareAccessWebSocketMiddleware(
    URLRouter([path("ws/whoami/", WhoAmIConsumer.as_asgi())])
)


def ws_connect(app, url: str, headers: list[tuple[bytes, bytes]]):
    async def attempt():
        communicator = WebsocketCommunicator(app, url, headers=headers)
        connected, code = await communicator.connect(timeout=10)
        received = await communicator.receive_from(timeout=10) if connected else None
        await communicator.disconnect()
        return connected, code, received

    return async_to_sync(attempt)()


@pytest.mark.django_db(transaction=True)  # database_sync_to_async closes connections
def test_a_good_token_passes_a_websocket_connect(access_on):
    connected, _, received = ws_connect(
        WS_APP, "/ws/whoami/", [(b"cf-access-jwt-assertion", token().encode())]
    )
    assert (connected, received) == (True, "alice@example.com")
    cookie = f"theme=dark; CF_Authorization={token(email='staff@example.com')}".encode()
    connected, _, received = ws_connect(WS_APP, "/ws/whoami/", [(b"cookie", cookie)])
    assert (connected, received) == (True, "staff@example.com")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: None, "no token"),
        (lambda: token(exp=int(time.time()) - 120), "expired"),
        (lambda: token(key=KEY_ATTACKER), "bad signature"),
        (hs256_token, "algorithm 'HS256' is not RS256"),
        (service_token, "service token outside the API"),
    ],
)
def test_a_bad_websocket_connect_is_refused(access_on, refusals, make, reason):
    tok = make()
    headers = [(b"cf-access-jwt-assertion", tok.encode())] if tok else []
    connected, _, _ = ws_connect(WS_APP, "/ws/whoami/", headers)
    assert connected is False
    message = refusals[-1].getMessage()
    assert message.startswith("Access refused WEBSOCKET /ws/whoami/")
    assert message.endswith(f": {reason}")


@pytest.mark.django_db(transaction=True)
def test_the_projects_asgi_application_checks_websockets(access_on, refusals):
    origin = (b"origin", b"http://localhost")
    # No token: refused before any route (or consumer) is reached.
    connected, code, _ = ws_connect(asgi_application, "/ws/runs/999999/", [origin])
    assert (connected, code) == (False, 1000)
    assert refusals[-1].getMessage().endswith(": no token")
    # A good token reaches the town's consumer, which answers "no such run" (4404).
    headers = [origin, (b"cf-access-jwt-assertion", token().encode())]
    connected, code, _ = ws_connect(asgi_application, "/ws/runs/999999/", headers)
    assert (connected, code) == (False, 4404)


# --- without Access -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # database_sync_to_async closes connections
def test_without_access_django_logins_apply_and_the_page_says_so(client, settings, rf):
    settings.CF_ACCESS_TEAM_DOMAIN = settings.CF_ACCESS_AUD = ""
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    notice = render_to_string("cloudflare_access/notice.html", request=rf.get("/"))
    assert "Running without Cloudflare Access" in notice
    connected, _, received = ws_connect(WS_APP, "/ws/whoami/", [])
    assert (connected, received) == (True, "anonymous")  # nothing checked: the consumer decides


def test_with_access_the_notice_is_empty(access_on, rf):
    notice = render_to_string("cloudflare_access/notice.html", request=rf.get("/"))
    assert "Running without" not in notice


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "team",
    [
        "pokotest",
        "pokotest.cloudflareaccess.com",
        "https://pokotest.cloudflareaccess.com",
        "https://pokotest.cloudflareaccess.com/",
    ],
)
def test_the_team_domain_may_be_written_several_ways(settings, team):
    settings.CF_ACCESS_TEAM_DOMAIN = team
    settings.CF_ACCESS_AUD = AUD
    config = access_config()
    assert config.issuer == TEAM
    assert config.certs_url == TEAM + CERTS_PATH
    assert config.audiences == (AUD,)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"CF_ACCESS_AUD": ""}, "CF_ACCESS_AUD is not set"),
        ({"CF_ACCESS_TEAM_DOMAIN": ""}, "CF_ACCESS_TEAM_DOMAIN is not set"),
        ({"CF_ACCESS_TEAM_DOMAIN": "http://pokotest.cloudflareaccess.com"}, "give the team domain"),
        ({"CF_ACCESS_CERTS_URL": "http://keys.example.com/certs"}, "must be https"),
        ({"CF_ACCESS_LEEWAY_S": -1}, "CF_ACCESS_LEEWAY_S=-1"),
        ({"CF_ACCESS_SERVICE_TOKEN_PATHS": ["api/"]}, "must start with '/'"),
        ({"CF_ACCESS_STAFF_EMAILS": "a@example.com"}, "must be a list"),
    ],
)
def test_bad_access_settings_say_what_to_change(settings, changes, message):
    settings.CF_ACCESS_TEAM_DOMAIN, settings.CF_ACCESS_AUD = TEAM, AUD
    for name, value in changes.items():
        setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        access_config()


def test_half_set_access_refuses_to_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO_ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "pokosite.settings.base",
            "POKOMACHI_VAR_DIR": str(tmp_path),
            "CF_ACCESS_TEAM_DOMAIN": "pokotest.cloudflareaccess.com",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "set both CF_ACCESS_TEAM_DOMAIN and CF_ACCESS_AUD" in result.stderr


# --- static files and unrouted WebSocket paths (issue 33, item 5) --------------------------


def _http_get(app, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """(status, body) of a GET through the ASGI application."""
    sent: list[dict] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    def finished() -> bool:  # the response's last body message has been sent
        return any(m["type"] == "http.response.body" and not m.get("more_body") for m in sent)

    async def receive():
        if requests:
            return requests.pop()
        # The client stays till the body's end: Django stops sending a response whose client
        # has gone (the response start alone was once taken for the end, and a loaded machine
        # then read an empty body).
        while not finished():
            await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": headers, "scheme": "http", "http_version": "1.1",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1234)}  # fmt: skip
    async_to_sync(app)(scope, receive, send)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body


@pytest.mark.django_db(transaction=True)  # the check runs in a thread: its own connection
def test_static_files_need_an_access_token_like_the_pages(access_on, refusals):
    # daphne serves /static/ before Django's middleware: the handler itself asks Access.
    status, body = _http_get(asgi_application, "/static/town/town.css", [])
    assert status == 403 and b"Cloudflare Access" in body
    assert refusals[-1].getMessage().startswith("Access refused GET /static/town/town.css")
    status, body = _http_get(
        asgi_application,
        "/static/town/town.css",
        [(b"cf-access-jwt-assertion", token().encode())],
    )
    assert status == 200 and body == (REPO_ROOT / "static/town/town.css").read_bytes()


@pytest.mark.django_db(transaction=True)
def test_without_access_static_files_stay_open(settings):
    settings.CF_ACCESS_TEAM_DOMAIN = settings.CF_ACCESS_AUD = ""
    assert _http_get(asgi_application, "/static/town/town.css", [])[0] == 200


@pytest.mark.django_db(transaction=True)
def test_a_websocket_path_no_route_matches_is_closed_with_4404(access_on):
    origin = (b"origin", b"http://localhost")
    headers = [origin, (b"cf-access-jwt-assertion", token().encode())]
    # 24 digits: past the id converter, so no route matches (was a 500 and a traceback).
    connected, code, _ = ws_connect(asgi_application, f"/ws/runs/{10**23}/", headers)
    assert (connected, code) == (False, 4404)
