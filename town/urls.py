"""The town view's URLs (mounted at the site root by pokosite/urls.py)."""

from __future__ import annotations

from django.urls import path

from town import converters, views

converters.register()

app_name = "town"

urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("runs/<id:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<id:run_id>/residents/<id:resident_id>/", views.run_resident, name="resident"),
    path("runs/<id:run_id>/replay/", views.run_replay_page, name="run-replay"),
    path("runs/<id:run_id>/replay.json", views.run_replay_data, name="run-replay-data"),
    path("runs/<id:run_id>/control/<str:control>/", views.run_control, name="run-control"),
]
