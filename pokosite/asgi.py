"""ASGI entry point (daphne): HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")
# Django must be set up before anything imports models (consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from pokosite.cloudflare_access.static import AccessStaticFilesHandler  # noqa: E402
from pokosite.cloudflare_access.websocket import CloudflareAccessWebSocketMiddleware  # noqa: E402
from pokosite.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # daphne serves /static/ itself (the town view's JS and CSS), from the finders, behind
        # Access like the pages.
        "http": AccessStaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            # Access inside the session stack: with Access on, the token's user replaces it.
            AuthMiddlewareStack(
                CloudflareAccessWebSocketMiddleware(URLRouter(websocket_urlpatterns))
            )
        ),
    }
)
