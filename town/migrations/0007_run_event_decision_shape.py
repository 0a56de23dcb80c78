"""Stored decision events take the REST API's decision shape (town/events.py): a client that
catches up on a run begun before sees the same keys as in a new event."""

from django.db import migrations

DECISION_KINDS = ("decision.started", "decision.applied")
# old key → the REST API's
RENAMES = {"decision_id": "id", "resident_id": "resident", "latency_s": "app_e2e_s"}


def _rename(apps, renames):
    RunEvent = apps.get_model("town", "RunEvent")
    events = RunEvent.objects.filter(kind__in=DECISION_KINDS).only("data")
    batch = []
    for event in events.iterator(chunk_size=2000):
        if any(old in event.data for old in renames):
            event.data = {renames.get(k, k): v for k, v in event.data.items()}
            batch.append(event)
        if len(batch) >= 2000:
            RunEvent.objects.bulk_update(batch, ["data"])
            batch = []
    RunEvent.objects.bulk_update(batch, ["data"])


def forwards(apps, schema_editor):
    _rename(apps, RENAMES)


def backwards(apps, schema_editor):
    _rename(apps, {new: old for old, new in RENAMES.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("town", "0006_run_checks"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
