"""tick_loop: the long-running process `make run` starts; advances every running run."""

from __future__ import annotations

import signal
import sys

from django.core.management.base import BaseCommand

from town.simulation import loop_forever
from town.tasks import decision_send


class Command(BaseCommand):
    help = "Advance running (and stepped) runs tick by tick, sending decisions to the nodes."

    def add_arguments(self, parser):
        parser.add_argument("--idle", type=float, default=1.0, help="seconds between checks")

    def handle(self, *args, idle: float, **options):
        # SIGTERM as Ctrl-C: leave mid-tick; the open tick is resumed on the next start.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.stdout.write("tick loop: waiting for running runs (Ctrl-C stops)")
        try:
            loop_forever(send=decision_send, idle_s=idle)
        except KeyboardInterrupt:
            self.stdout.write("tick loop: stopped")
