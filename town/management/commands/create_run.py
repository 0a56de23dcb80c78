"""create_run: a new run of a town, to be started with run_control (and ticked by tick_loop)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from town import services
from town.demo import DEMO_TOWN_NAME
from town.errors import TownError
from town.models import DEFAULT_TEMPERATURE, Run, Town
from town.rules.prompts import LAYOUTS


def add_run_arguments(parser) -> None:
    parser.add_argument("--town", default=DEMO_TOWN_NAME, help="the town's name")
    parser.add_argument("--layout", choices=LAYOUTS, default="shared_head")
    parser.add_argument("--nodes", default="", help="comma-separated nodes (default: all)")
    parser.add_argument(
        "--routing",
        choices=Run.Routing.values,
        default=None,
        help="how decisions are spread over the nodes (default: POKOMACHI_ROUTING, cache_aware)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="decisions in flight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"sampling temperature, 0 for greedy (default {DEFAULT_TEMPERATURE}; each decision "
        "has its own seed from --seed, so a run reproduces)",
    )
    parser.add_argument("--minutes-per-tick", type=int, default=120)
    parser.add_argument(
        "--decision-timeout",
        type=float,
        default=None,
        help="seconds (default: the broker's visibility timeout + 300)",
    )
    parser.add_argument("--retention-interval", type=int, default=None, help="tokens")


def run_create_from_options(*, ticks_target: int | None, **options):
    town = Town.objects.filter(name=options["town"]).first()
    if town is None:
        raise CommandError(f"no town {options['town']!r}; build the demo town with seed_town")
    nodes = [n.strip() for n in options["nodes"].split(",") if n.strip()] or None
    try:
        return services.run_create(
            town=town,
            layout=options["layout"],
            nodes=nodes,
            routing=options.get("routing"),
            concurrency=options["concurrency"],
            seed=options["seed"],
            ticks_target=ticks_target,
            retention_interval=options["retention_interval"],
            temperature=options["temperature"],
            minutes_per_tick=options["minutes_per_tick"],
            decision_timeout_s=options["decision_timeout"],
        )
    except TownError as exc:
        raise CommandError(str(exc)) from exc


class Command(BaseCommand):
    help = "Create a run (status created); start it with run_control <id> start."

    def add_arguments(self, parser):
        add_run_arguments(parser)
        parser.add_argument("--ticks", type=int, default=None, help="stop after N ticks")
        parser.add_argument("--start", action="store_true", help="start it at once")

    def handle(self, *args, ticks: int | None, start: bool, **options):
        run = run_create_from_options(ticks_target=ticks, **options)
        if start:
            run = services.run_start(run=run)
        self.stdout.write(
            f"run {run.pk}: {run.layout} on {run.nodes} ({run.routing}), {run.status}"
        )
