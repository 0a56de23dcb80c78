"""The Celery app, configured from Django settings (the CELERY_ namespace).

Workers: `celery -A pokosite worker -Q <node> --pool threads --concurrency 16 -n <node>@%h`,
one per inference node; tasks are found in each installed app's tasks.py.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")

app = Celery("pokosite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
