"""town_quality: how well the residents decide, measured (town/quality.py defines each number).

    manage.py town_quality                  run the town one simulated day, then measure it
    manage.py town_quality --ticks 4        a shorter run
    manage.py town_quality --run 7          measure a run that exists already

Prints the echo rate (with examples), needs met, variety, validity, the token cache hit rate
and median end-to-end beside them, and 20 sampled decisions for a person to read; stores the
numbers on the run, where the admin and the compare page show them.
"""

from __future__ import annotations

import textwrap

from django.core.management.base import BaseCommand, CommandError

from town.management.commands.create_run import add_run_arguments
from town.management.commands.run_town import run_ticks
from town.models import Run
from town.quality import TownQuality
from town.rules.clock import MINUTES_PER_DAY
from town.services.quality import run_quality_measure


class Command(BaseCommand):
    help = "Run the town (one simulated day by default) and measure its decisions' quality."

    def add_arguments(self, parser):
        add_run_arguments(parser)
        parser.add_argument(
            "--ticks", type=int, default=None, help="ticks to run (default: one simulated day)"
        )
        parser.add_argument("--run", type=int, default=None, help="measure this run instead")
        parser.add_argument(
            "--workers",
            action="store_true",
            help="compute decisions on the node workers (default: in this process)",
        )

    def handle(self, *args, ticks, run: int | None, workers: bool, **options):
        if run is not None:
            found = Run.objects.filter(pk=run).first()
            if found is None:
                raise CommandError(f"no run {run}; the admin lists the runs (/admin/town/run/)")
        else:
            ticks = ticks or -(-MINUTES_PER_DAY // options["minutes_per_tick"])
            found = run_ticks(self, ticks=ticks, inline=not workers, **options)
            if found is None:
                return
        quality = run_quality_measure(run=found)
        self.stdout.write(quality_text(found, quality))


def quality_text(run: Run, quality: TownQuality) -> str:
    width = max(len(label) for label, _ in quality.rows())
    lines = [f"\nrun {run.pk} ({run.layout}, {run.model}, {run.num_ticks_done} ticks) quality"]
    lines += [f"  {label:<{width}}  {value}" for label, value in quality.rows()]
    if quality.echo_examples:
        lines.append("\necho examples (the reason, then what of the prompt it copies):")
        lines += [
            f"  {e['reason']!r}\n      <- {e['copies'][:100]!r}" for e in quality.echo_examples
        ]
    lines.append(f"\n{len(quality.samples)} sampled decisions:")
    for s in quality.samples:
        lines.append(f"- {s['clock']}, {s['resident']}: {s['state']}")
        lines.append(textwrap.indent(textwrap.fill(f"offered {s['options']}", 96), "    "))
        lines.append(
            f"    -> {s['decision']}: {s['reason']!r}" + (f"  [{s['note']}]" if s["note"] else "")
        )
    return "\n".join(lines)
