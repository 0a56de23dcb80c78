"""WSGI entry point, for tools that want one; the site itself is served over ASGI by daphne."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")

application = get_wsgi_application()
