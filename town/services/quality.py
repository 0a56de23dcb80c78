"""A run's decision quality (town/quality.py's definitions) from its stored decisions, kept on
the run (`Run.quality`) so the admin and the compare page show it."""

from __future__ import annotations

from town.models import Decision, Place, Resident, Run
from town.quality import DecisionRecord, FoodOffer, TownQuality, town_quality_measure
from town.rules.needs import cheapest_food, is_food
from town.rules.world import HOME_MEAL
from town.selectors import place_view, run_clock, run_summary


def options_from_schema(schema: dict) -> dict[str, list[str]]:
    """The (action → targets) a decision schema offered (town/rules/schema.py's shape)."""
    cases = schema.get("anyOf") or [schema]
    return {
        case["properties"]["action"]["const"]: list(case["properties"]["target"]["enum"])
        for case in cases
    }


def food_offer(*, run: Run) -> FoodOffer:
    """The town's food by the rules' own definition (town/rules/needs.py): its items, and the
    cheapest food of each place that sells some."""
    items: set[str] = set()
    places: dict[str, int] = {}
    for place in Place.objects.filter(town_id=run.town_id):
        view = place_view(place, frozenset())
        items.update(i.item for i in view.menu if is_food(view, i.item))
        price = cheapest_food(view, is_home=False)
        if price is not None:
            places[place.name] = price
    return FoodOffer(items=frozenset(items), places=places)


def decision_records(*, run: Run) -> list[DecisionRecord]:
    places = dict(Place.objects.filter(town_id=run.town_id).values_list("id", "name"))
    people = Resident.objects.filter(town_id=run.town_id).values_list("name", flat=True)
    menus = Place.objects.filter(town_id=run.town_id).values_list("menu", flat=True)
    items = [item["item"] for menu in menus for item in menu]
    names = frozenset([*places.values(), *people, *items, HOME_MEAL.item])
    decisions = (
        Decision.objects.filter(run=run, status=Decision.Status.APPLIED)
        .select_related("tick", "resident")
        .order_by("tick__index", "resident_id")
    )
    records = []
    for d in decisions:
        state = d.resident_state
        records.append(
            DecisionRecord(
                resident=d.resident.name,
                tick_index=d.tick.index,
                clock=run_clock(run=run, tick_index=d.tick.index).label(),
                home=places.get(d.resident.home_id, ""),
                place=places.get(state["place_id"], "?"),
                money=state["money"],
                hunger=state["hunger"],
                energy=state["energy"],
                options=options_from_schema(d.json_schema),
                prompt=[m["content"] for m in d.messages],
                action=d.action,
                target=d.target,
                reason=d.reason,
                valid=bool(d.valid),
                retried=d.attempts > 1,
                error=d.error,
                names=names,
            )
        )
    return records


def run_quality_measure(*, run: Run) -> TownQuality:
    """Measure the run's applied decisions and store the result on the run."""
    summary = run_summary(run=run)
    quality = town_quality_measure(
        decision_records(run=run),
        food=food_offer(run=run),
        hit_rate=summary.token_cache_hit_rate if summary.num_decisions else None,
        median_e2e_s=summary.median_e2e_s if summary.num_decisions else None,
        seed=run.seed,
    )
    run.quality = quality.to_json()
    run.save(update_fields=["quality"])
    return quality
