"""run_town --ticks N: a bounded run from the command line, with a progress bar and, at the end,
the talk's summary (slide 15): token cache hit rate, cached tokens, prefill / queue / decode,
median end-to-end, prompt tokens."""

from __future__ import annotations

import contextlib

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference.fleet.nodes import nodes_without_worker
from town import services
from town.errors import RunStateError
from town.management.commands.create_run import add_run_arguments, run_create_from_options
from town.models import Run
from town.selectors import run_summary, tick_failure
from town.simulation import InlineSend, lease_owner_name, tick_run
from town.tasks import decision_send


def run_ticks(command: BaseCommand, *, ticks: int, inline: bool, **options) -> Run | None:
    """Create a run from the command's options and run it for `ticks` ticks; None when Ctrl-C
    stopped it (it can be resumed). CommandError (a non-zero exit) when a tick's decisions all
    failed, with the first one's error."""
    if ticks < 1:
        raise CommandError(f"--ticks must be at least 1, got {ticks}")
    run = run_create_from_options(ticks_target=ticks, **options)
    if inline:
        send = InlineSend(max_workers=run.concurrency)
    else:
        missing = nodes_without_worker(run.nodes)
        if missing:
            run.delete()
            raise CommandError(
                f"no Celery worker consumes the queue of node(s) {missing}: start one per "
                "node with `celery -A pokosite worker -Q <node> --pool threads "
                "--concurrency 4`, or run `make run`, or pass --inline"
            )
        send = decision_send
    run = services.run_start(run=run)
    owner = lease_owner_name(command.__module__.rsplit(".", 1)[-1])
    num_residents = run.resident_states.count()
    command.stdout.write(
        f"run {run.pk}: {ticks} ticks of {run.town.name}, layout {run.layout}, "
        f"model {run.model}, nodes {run.nodes}, {run.concurrency} in flight"
    )
    try:
        with tqdm(total=ticks * num_residents, unit="decision") as bar:
            for _ in range(ticks):
                tick = tick_run(run_id=run.pk, send=send, owner=owner, progress=bar.update)
                if tick is None:
                    raise CommandError(f"run {run.pk} is being advanced by another process")
                failure = tick_failure(tick=tick)
                if failure is not None:  # the next tick would fail the same way
                    with contextlib.suppress(RunStateError):  # its last tick: finished already
                        services.run_stop(run=run)
                    raise CommandError(failure)
    except KeyboardInterrupt:
        services.run_stop(run=run)
        command.stdout.write(f"stopped; resume with: manage.py run_control {run.pk} resume")
        return None
    finally:
        services.run_lease_release(run=run, owner=owner)
        if inline:
            send.shutdown()
    run.refresh_from_db()
    return run


class Command(BaseCommand):
    help = "Run the town for N ticks and print the summary of its decisions."

    def add_arguments(self, parser):
        add_run_arguments(parser)
        parser.add_argument("--ticks", type=int, required=True, help="how many ticks to run")
        parser.add_argument(
            "--inline",
            action="store_true",
            help="compute decisions in this process (its own engine) instead of on the workers",
        )

    def handle(self, *args, ticks: int, inline: bool, **options):
        run = run_ticks(self, ticks=ticks, inline=inline, **options)
        if run is not None:
            self.stdout.write(self.summary_text(run))

    @staticmethod
    def summary_text(run) -> str:
        summary = run_summary(run=run)
        width = max(len(label) for label, _ in summary.rows())
        lines = [f"\nrun {run.pk} ({run.layout}) summary"]
        lines += [f"  {label:<{width}}  {value}" for label, value in summary.rows()]
        return "\n".join(lines)
