"""tick_loop: the long-running process `make run` starts; advances every running run."""

from __future__ import annotations

import signal

from django.core.management.base import BaseCommand

from town import services
from town.models import Run, Town
from town.simulation import loop_forever
from town.tasks import decision_send


class Command(BaseCommand):
    help = "Advance running (and stepped) runs tick by tick, sending decisions to the nodes."

    def add_arguments(self, parser):
        parser.add_argument("--idle", type=float, default=1.0, help="seconds between checks")
        parser.add_argument(
            "--no-first-run",
            action="store_true",
            help="do not start a run when the database has towns but no run yet",
        )

    def handle(self, *args, idle: float, no_first_run: bool, **options):
        if not no_first_run:
            self.first_run_start()
        # SIGTERM (the launcher's, docker's stop) as Ctrl-C: leave mid-tick; the open tick is
        # resumed on the next start.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        self.stdout.write("tick loop: waiting for running runs (Ctrl-C stops)")
        try:
            loop_forever(send=decision_send, idle_s=idle)
        except KeyboardInterrupt:
            self.stdout.write("tick loop: stopped")

    def first_run_start(self) -> None:
        """On a fresh install, start the first town's first run, so `make run` shows a live town."""
        town = Town.objects.order_by("id").first()
        if town is None or Run.objects.exists():
            return
        run = services.run_start(run=services.run_create(town=town))
        self.stdout.write(f"tick loop: started run {run.pk} of {town.name} ({run.layout})")
