"""experiment --preset talk: the talk's steps, one stored Run each, and its summary table."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from town.demo import DEMO_TOWN_NAME
from town.errors import TownError
from town.models import Town
from town.reports import experiment_table
from town.services.experiments import PRESETS, experiment_run


class Command(BaseCommand):
    help = (
        "Rerun the talk's study: the same town from the same seed once per step (layout and "
        "retention interval), each step a stored Run on a fresh engine; prints the slide-15 "
        "table with changes against step 1 and the admin page comparing the runs."
    )

    def add_arguments(self, parser):
        parser.add_argument("--preset", choices=sorted(PRESETS), default="talk")
        parser.add_argument("--model", default=None, help="model name (default: POKOMACHI_MODEL)")
        parser.add_argument("--ticks", type=int, default=2, help="ticks per step (2)")
        parser.add_argument("--residents", type=int, default=4, help="residents taking part (4)")
        parser.add_argument("--seed", type=int, default=0, help="same seed, same prompts (0)")
        parser.add_argument(
            "--scale",
            type=float,
            default=None,
            help="prompt and interval scale against the talk (default: our shared head at step "
            "2 over the talk's 2,247 tokens)",
        )
        parser.add_argument("--town", default=DEMO_TOWN_NAME, help="the town's name")

    def handle(self, *args, preset, model, ticks, residents, seed, scale, town, **options):
        found = Town.objects.filter(name=town).first()
        if found is None:
            raise CommandError(f"no town {town!r}; build the demo town with `manage.py seed_town`")
        if scale is not None and not 0 < scale <= 1:
            raise CommandError(f"--scale must be in (0, 1], got {scale}")
        try:
            experiment = experiment_run(
                town=found,
                model=model,
                ticks=ticks,
                num_residents=residents,
                seed=seed,
                scale=scale,
                steps=PRESETS[preset],
                progress=lambda text: self.stderr.write(text),
            )
        except TownError as exc:
            raise CommandError(str(exc)) from exc
        ids = ",".join(str(r.run.pk) for r in experiment.steps)
        site = os.environ.get("POKOMACHI_SITE_URL", "http://127.0.0.1:8000").rstrip("/")
        self.stdout.write(
            f"\n{preset} on {experiment.model}, {ticks} ticks × {residents} residents, seed {seed}"
        )
        self.stdout.write(experiment.scaling.describe() + "\n")
        self.stdout.write(experiment_table(experiment=experiment))
        self.stdout.write(
            f"\ncompare in admin: {site}{reverse('admin:town_run_compare')}?ids={ids}"
        )
