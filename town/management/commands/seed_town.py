"""seed_town: build the demo town (deterministic from --seed); a no-op when it exists."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from town.demo import DEMO_TOWN_NAME, demo_town_create, demo_town_replace
from town.models import Town


class Command(BaseCommand):
    help = "Build the demo town Pokomachi: ~10 residents, 12 places, the same for the same seed."

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=0, help="which residents, where (0)")
        parser.add_argument("--name", default=DEMO_TOWN_NAME, help="the town's name")
        parser.add_argument(
            "--replace", action="store_true", help="delete the town (and its runs) and rebuild it"
        )

    def handle(self, *args, seed: int, name: str, replace: bool, **options):
        if not replace and Town.objects.filter(name=name).exists():
            self.stdout.write(f"town {name!r} exists already; --replace rebuilds it")
            return
        builder = demo_town_replace if replace else demo_town_create
        town = builder(seed=seed, name=name)
        self.stdout.write(
            self.style.SUCCESS(
                f"seeded {town.name!r} (seed {seed}): {town.places.count()} places, "
                f"{town.residents.count()} residents"
            )
        )
