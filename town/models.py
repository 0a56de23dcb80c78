"""The town's data: a Town of Places and Residents, and Runs that simulate it tick by tick.

A Resident holds its profile and starting state; each Run copies that into ResidentStates, so two
runs of one town (say a `naive` and a `shared_head` layout) start from the same state and never
disturb each other. Every Decision keeps its prompt, its raw output and every engine metric.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q


class Town(models.Model):
    name = models.CharField(max_length=100, unique=True)
    seed = models.IntegerField(default=0, help_text="The seed seed_town built it from.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Place(models.Model):
    class Kind(models.TextChoices):
        KISSATEN = "kissaten", "kissaten (喫茶店)"
        CAFE = "cafe", "café (カフェ)"
        BAKERY = "bakery", "bakery (パン屋)"
        BOOKSHOP = "bookshop", "bookshop (本屋)"
        PARK = "park", "park (公園)"
        SHRINE = "shrine", "shrine (神社)"
        STATION = "station", "station (駅)"
        IZAKAYA = "izakaya", "izakaya (居酒屋)"
        SENTO = "sento", "bathhouse (銭湯)"
        HOME = "home", "home (家)"

    town = models.ForeignKey(Town, on_delete=models.CASCADE, related_name="places")
    name = models.CharField(max_length=60)
    name_ja = models.CharField(max_length=60, blank=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    description = models.CharField(max_length=200, blank=True)
    x = models.IntegerField(help_text="Map position, 0..100.")
    y = models.IntegerField(help_text="Map position, 0..100.")
    opens_at = models.IntegerField(help_text="Minute of the day; equal to closes_at: always open.")
    closes_at = models.IntegerField(help_text="Minute of the day; before opens_at: past midnight.")
    capacity = models.PositiveIntegerField()
    # [{"item": "blend coffee", "price": 450, "hunger": -5, "energy": 10}, ...]
    menu = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["town", "name"], name="place_name_unique")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_home(self) -> bool:
        return self.kind == self.Kind.HOME


class Resident(models.Model):
    town = models.ForeignKey(Town, on_delete=models.CASCADE, related_name="residents")
    name = models.CharField(max_length=60)
    age = models.PositiveIntegerField()
    occupation = models.CharField(max_length=80)
    personality = models.CharField(max_length=300)
    likes = models.JSONField(default=list, help_text='e.g. ["café", "music"]')
    home = models.ForeignKey(Place, on_delete=models.PROTECT, related_name="household")
    workplace = models.ForeignKey(
        Place, on_delete=models.SET_NULL, null=True, blank=True, related_name="staff"
    )
    wage_per_hour = models.PositiveIntegerField(default=0)
    # Starting state; each Run copies it into a ResidentState.
    money = models.IntegerField()
    hunger = models.IntegerField(help_text="0 full .. 100 starving")
    energy = models.IntegerField(help_text="0 exhausted .. 100 rested")
    visits = models.JSONField(default=dict, help_text="{place id: times visited}")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["town", "name"], name="resident_name_unique")
        ]

    def __str__(self) -> str:
        return self.name


class RunLayout(models.TextChoices):
    """How a run's prompts are laid out for the prefix cache (town/rules/prompts.py: LAYOUTS)."""

    NAIVE = "naive"
    SHARED_RULES = "shared_rules"
    SHARED_HEAD = "shared_head"
    SHARED_HEAD_SCHEMA_ONLY = "shared_head_schema_only"
    SHARED_THEN_RESIDENT_HEAD = "shared_then_resident_head"


class RunRouting(models.TextChoices):
    """Which node a decision goes to (inference/fleet/router.py: POLICIES)."""

    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    FIXED = "fixed"


# A run samples at this temperature unless told otherwise. Greedy decoding (0) at 135M turns a
# town into four actions on repeat; sampling gives the residents variety and still reproduces:
# every decision has its own seed (run seed, tick, resident: services/decisions.py).
# docs/TOWN.md has the measurements; the experiment keeps 0 (its steps compare greedy outputs).
DEFAULT_TEMPERATURE = 0.7


def _validate_temperature(value: float) -> None:
    if not 0 <= value <= 2:  # NaN too
        raise ValidationError(
            "temperature must be within 0..2 (0: greedy), got %(value)s", params={"value": value}
        )


def _validate_decision_timeout_s(value: float) -> None:
    if not value > 0:  # NaN too
        raise ValidationError(
            "decision_timeout_s must be positive, got %(value)s", params={"value": value}
        )


def _at_least(low: int, message: str) -> MinValueValidator:
    return MinValueValidator(low, message=message + ", got %(show_value)s")


class Run(models.Model):
    """A run's settings are checked twice: by the fields' validators (run_create calls
    full_clean, so a bad value is a TownError that says how to fix it) and by the database's
    CHECK constraints (nothing, not even an update(), stores one). The deployment's own checks
    (nodes, model, retention interval) stay in the service: they depend on the environment."""

    Layout = RunLayout
    Routing = RunRouting

    class Status(models.TextChoices):
        CREATED = "created"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPED = "stopped"
        FINISHED = "finished"

    town = models.ForeignKey(Town, on_delete=models.CASCADE, related_name="runs")
    layout = models.CharField(
        max_length=30,
        choices=Layout.choices,
        default=Layout.SHARED_HEAD,
        error_messages={
            "invalid_choice": "unknown layout %(value)r; use one of " + ", ".join(Layout.values)
        },
    )
    model = models.CharField(max_length=100, help_text="The model the nodes serve.")
    nodes = models.JSONField(default=list, help_text="Inference node names, decisions spread.")
    routing = models.CharField(
        max_length=20,
        choices=RunRouting.choices,
        default=RunRouting.CACHE_AWARE,
        error_messages={
            "invalid_choice": "unknown routing %(value)r; use one of "
            + ", ".join(RunRouting.values)
        },
        help_text="How decisions are spread over the nodes (inference/fleet/router.py).",
    )
    concurrency = models.PositiveIntegerField(
        default=4,
        validators=[_at_least(1, "concurrency must be at least 1 decision in flight")],
        help_text="Decisions in flight at most.",
    )
    retention_interval = models.PositiveIntegerField(
        null=True, blank=True, help_text="Prefix-cache retention interval in tokens (None: dense)."
    )
    seed = models.IntegerField(default=0)
    diary_chars = models.PositiveIntegerField(
        default=0,
        validators=[_at_least(0, "diary_chars must be 0 or more characters")],
        help_text="Characters of older diary per resident in each prompt (the experiment scales "
        "prompts to the talk's proportions with it); 0: none.",
    )
    temperature = models.FloatField(default=DEFAULT_TEMPERATURE, validators=[_validate_temperature])
    max_tokens = models.PositiveIntegerField(default=160)
    start_minutes = models.PositiveIntegerField(default=7 * 60, help_text="Day 1, 07:00.")
    minutes_per_tick = models.PositiveIntegerField(
        default=120, validators=[_at_least(1, "minutes_per_tick must be at least 1")]
    )
    decision_timeout_s = models.FloatField(
        default=1200.0,
        validators=[_validate_decision_timeout_s],
        help_text="A decision not answered by then: timed out, resident stays.",
    )
    ticks_target = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[_at_least(1, "ticks_target must be at least 1 (or None: no end)")],
        help_text="None: no end.",
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.CREATED)
    num_ticks_done = models.PositiveIntegerField(default=0)
    quality = models.JSONField(
        default=dict,
        blank=True,
        help_text="Decision quality (manage.py town_quality; town/quality.py defines each).",
    )
    num_steps_pending = models.PositiveIntegerField(default=0)
    # Who advances the run now (a tick_loop or run_town process) and until when.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(layout__in=RunLayout.values), name="run_layout_known"
            ),
            models.CheckConstraint(
                condition=Q(routing__in=RunRouting.values), name="run_routing_known"
            ),
            models.CheckConstraint(condition=Q(concurrency__gte=1), name="run_concurrency_min"),
            models.CheckConstraint(
                condition=Q(ticks_target__isnull=True) | Q(ticks_target__gte=1),
                name="run_ticks_target_min",
            ),
            models.CheckConstraint(
                condition=Q(minutes_per_tick__gte=1), name="run_minutes_per_tick_min"
            ),
            models.CheckConstraint(
                condition=Q(decision_timeout_s__gt=0), name="run_decision_timeout_s_positive"
            ),
            models.CheckConstraint(
                condition=Q(temperature__gte=0, temperature__lte=2), name="run_temperature_range"
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.layout}, {self.status})"


class ResidentState(models.Model):
    """A resident's live state within one run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="resident_states")
    resident = models.ForeignKey(Resident, on_delete=models.CASCADE, related_name="states")
    place = models.ForeignKey(Place, on_delete=models.PROTECT, related_name="+")
    money = models.IntegerField()
    hunger = models.IntegerField()
    energy = models.IntegerField()
    visits = models.JSONField(default=dict)

    class Meta:
        ordering = ["resident_id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "resident"], name="resident_state_unique")
        ]


class Memory(models.Model):
    """What a resident saw and did. run None: a background memory every run starts with."""

    resident = models.ForeignKey(Resident, on_delete=models.CASCADE, related_name="memories")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, null=True, blank=True, related_name="memories"
    )
    tick_index = models.IntegerField(null=True, blank=True)
    text = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]  # recent first
        verbose_name_plural = "memories"


class Tick(models.Model):
    class Status(models.TextChoices):
        DECIDING = "deciding"
        DONE = "done"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ticks")
    index = models.PositiveIntegerField()
    day = models.PositiveIntegerField()
    minute_of_day = models.PositiveIntegerField()
    phase = models.CharField(max_length=10)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DECIDING)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="tick_index_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} tick {self.index}"


# The engine's per-decision metrics (vLLM definitions) and the app's own latencies, as stored
# on Decision: shown together by the admin and the API.
DECISION_METRIC_FIELDS = [
    "num_prompt_tokens",
    "num_cached_tokens",
    "num_output_tokens",
    "lost_tokens",
    "queue_s",
    "prefill_s",
    "decode_s",
    "ttft_s",
    "engine_e2e_s",
    "app_e2e_s",
    "app_latency_s",
]


class Decision(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # created, not yet sent to a node
        QUEUED = "queued"  # on the node's queue
        RUNNING = "running"  # a worker has it
        COMPUTED = "computed"  # the engine answered; waits to be applied
        FAILED = "failed"  # the engine refused or kept failing
        TIMED_OUT = "timed_out"  # no answer within the run's decision_timeout_s
        APPLIED = "applied"  # applied to the town (valid or not)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="decisions")
    tick = models.ForeignKey(Tick, on_delete=models.CASCADE, related_name="decisions")
    resident = models.ForeignKey(Resident, on_delete=models.CASCADE, related_name="decisions")
    node = models.CharField(max_length=60)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    # The prompt: chat messages (sections ending in a cache breakpoint carry "cache": True, one
    # resident's own also "scope": "resident"), its hashes, the schema.
    messages = models.JSONField()
    prompt_hash = models.CharField(max_length=64)
    head_hash = models.CharField(max_length=64, blank=True, help_text="Of the shared sections.")
    json_schema = models.JSONField()
    resident_state = models.JSONField(help_text="The resident's state as the prompt saw it.")
    # The answer and what the town made of it.
    raw_output = models.TextField(blank=True)
    output_token_ids = models.JSONField(default=list, blank=True)
    finish_reason = models.CharField(max_length=20, blank=True)
    action = models.CharField(max_length=20, blank=True)
    target = models.CharField(max_length=100, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    valid = models.BooleanField(null=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Times a worker started it.")
    retries = models.PositiveIntegerField(default=0, help_text="Attempts after the first.")
    worker = models.CharField(max_length=200, blank=True)
    # Sends: the tick loop sends a decision again when no worker has begun it for a while (a
    # worker that died right after taking the message off the queue lost it for good); only one
    # send's delivery computes (see services/decisions.py).
    num_sends = models.PositiveIntegerField(
        default=0, help_text="Times the tick loop put it on its node's queue."
    )
    started_send = models.PositiveIntegerField(
        null=True, blank=True, help_text="The send whose delivery began the last attempt."
    )
    # Set at dispatch: the tick loop's (settings.INFERENCE_PRIORITY_TICK) or, asked for through
    # the API, settings.INFERENCE_PRIORITY_REQUESTED, which goes ahead of the town's batch.
    priority = models.IntegerField(
        null=True, blank=True, help_text="The engine's scheduling class (lower goes first)."
    )
    # Engine metrics (vLLM definitions), as the engine reported them.
    num_prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    num_cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    num_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    lost_tokens = models.JSONField(default=dict, blank=True, help_text="{reason: tokens}")
    queue_s = models.FloatField(null=True, blank=True)
    prefill_s = models.FloatField(null=True, blank=True)
    decode_s = models.FloatField(null=True, blank=True)
    ttft_s = models.FloatField(null=True, blank=True)
    engine_e2e_s = models.FloatField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True, help_text="Everything, as reported.")
    # The app's own timeline. app_e2e_s: dispatched → answered (the talk's end-to-end, "the
    # app's call to the response"); app_latency_s: dispatched → applied to the town.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    app_e2e_s = models.FloatField(null=True, blank=True)
    app_latency_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["tick_id", "resident_id"]
        constraints = [
            models.UniqueConstraint(fields=["tick", "resident"], name="decision_per_tick_unique")
        ]
        indexes = [models.Index(fields=["run", "status"])]

    def __str__(self) -> str:
        # The tick's index within its run, as every page and the API show it: not its row id.
        return f"decision {self.pk} ({self.resident.name} @ tick {self.tick.index}: {self.status})"


class RunEvent(models.Model):
    """What the live view was told about a run, in order (town/events.py writes them).

    `seq` counts from 1 within a run without gaps, in commit order, so a client that reconnects
    asks for the events after the last seq it saw and gets exactly the ones it missed.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="run_event_seq_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} event {self.seq} ({self.kind})"
