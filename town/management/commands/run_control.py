"""run_control <run id> start|pause|resume|step|stop — the same services the web buttons call."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from town import services
from town.errors import TownError
from town.models import Run

CONTROLS = services.RUN_CONTROLS


class Command(BaseCommand):
    help = "Control a run; the tick loop (make run, or manage.py tick_loop) does the ticking."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("control", choices=sorted(CONTROLS))

    def handle(self, *args, run_id: int, control: str, **options):
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}; create one with create_run or run_town")
        try:
            run = CONTROLS[control](run=run)
        except TownError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"run {run.pk}: {run.status} ({run.num_ticks_done} ticks done)")
