"""The demo town, Pokomachi: twelve places and a pool of residents, built deterministically.

`demo_town_create(seed=...)` always builds the same town from the same seed: which residents
from the pool live here, where, with how much money, how hungry and how rested.
"""

from __future__ import annotations

import random

from django.db import transaction

from town.errors import TownError
from town.models import Memory, Place, Resident, Town

DEMO_TOWN_NAME = "Pokomachi"
NUM_DEMO_RESIDENTS = 10


# name, 日本語, kind, about, x, y, opens, closes (hours; equal: always open), capacity
PLACES = [
    ("Kissa Komorebi", "喫茶こもれび", "kissaten", "old, jazz records, a cat", 22, 30, 8, 20, 6),
    ("Cafe Sora", "カフェそら", "cafe", "new, live music at night", 48, 26, 9, 22, 8),
    ("Panya Mugi", "パン屋むぎ", "bakery", "famous melon pan", 35, 48, 7, 18, 4),
    ("Hondana Books", "本棚書店", "bookshop", "has a reading corner", 60, 44, 10, 20, 6),
    ("Sakura Park", "さくら公園", "park", "cherry trees and a pond", 75, 62, 0, 0, 30),
    ("Inari Shrine", "稲荷神社", "shrine", "red torii on a quiet hill", 85, 20, 6, 18, 20),
    ("Pokomachi Station", "ぽこまち駅", "station", "trains to the city", 50, 85, 5, 0.5, 40),
    ("Izakaya Tanuki", "居酒屋たぬき", "izakaya", "cosy, a tanuki statue", 30, 70, 17, 1, 10),
    (
        "Sento Yunohana",
        "銭湯ゆのはな",
        "sento",
        "public bath, Mount Fuji mural",
        12,
        55,
        15,
        23,
        10,
    ),
    ("Sakura-so", "さくら荘", "home", "apartment house", 15, 12, 0, 0, 8),
    ("Midori House", "みどりの家", "home", "house with a garden", 68, 10, 0, 0, 6),
    ("Aoki House", "青木家", "home", "old house by the river", 88, 78, 0, 0, 6),
]

# place → (item, price in yen, hunger change, energy change)
MENUS = {
    "Kissa Komorebi": [
        ("blend coffee", 450, -5, 10),
        ("napolitan", 850, -45, 5),
        ("custard pudding", 400, -15, 0),
    ],
    "Cafe Sora": [
        ("latte", 550, -5, 10),
        ("matcha latte", 600, -5, 8),
        ("egg sandwich", 700, -35, 0),
    ],
    "Panya Mugi": [("melon pan", 180, -20, 0), ("curry pan", 220, -30, 0), ("anpan", 160, -20, 0)],
    "Hondana Books": [
        ("paperback novel", 900, 0, 0),
        ("manga volume", 550, 0, 0),
        ("town magazine", 700, 0, 0),
    ],
    "Sakura Park": [("vending machine green tea", 150, 0, 5)],
    "Inari Shrine": [("omikuji fortune", 200, 0, 0), ("omamori charm", 800, 0, 0)],
    "Pokomachi Station": [("ekiben lunch box", 1100, -50, 0), ("canned coffee", 130, 0, 8)],
    "Izakaya Tanuki": [
        ("yakitori", 600, -30, 0),
        ("draft beer", 500, -5, -5),
        ("onigiri", 250, -25, 0),
    ],
    "Sento Yunohana": [("bath", 520, 0, 20), ("coffee milk", 150, -5, 5)],
}


def _minutes(hour: float) -> int:
    return int(hour * 60) % (24 * 60)


# name, age, occupation, personality, likes, workplace (place name or None), wage
RESIDENT_POOL = [
    (
        "Haruto Sato",
        68,
        "retired teacher",
        "calm and curious, walks every morning, loves to explain history to anyone who listens",
        ["books", "green tea", "shrines"],
        None,
        0,
    ),
    (
        "Yui Tanaka",
        20,
        "university student",
        "cheerful and restless, always looking for a new place to study or hang out",
        ["cafe", "music", "sweets"],
        None,
        0,
    ),
    (
        "Sota Suzuki",
        34,
        "baker",
        "an early riser, proud of his bread, shy with strangers",
        ["bread", "quiet mornings", "baths"],
        "Panya Mugi",
        1200,
    ),
    (
        "Aoi Takahashi",
        29,
        "office worker who commutes to the city",
        "punctual and tired, treats herself to good coffee",
        ["coffee", "novels", "trains"],
        None,
        0,
    ),
    (
        "Ren Watanabe",
        26,
        "street musician",
        "easygoing and sociable, plays guitar in the park",
        ["music", "izakaya", "people"],
        None,
        0,
    ),
    (
        "Mei Ito",
        52,
        "owner of Kissa Komorebi",
        "warm and talkative, knows everyone's news",
        ["kissaten", "jazz", "gossip"],
        "Kissa Komorebi",
        1500,
    ),
    (
        "Yuto Yamamoto",
        41,
        "salesman",
        "hard-working and a little lonely, unwinds with beer",
        ["beer", "baths", "baseball"],
        None,
        0,
    ),
    (
        "Hina Nakamura",
        16,
        "high-school student",
        "bubbly, loves manga and sweet bread",
        ["manga", "melon pan", "cafe"],
        None,
        0,
    ),
    (
        "Kenji Kobayashi",
        60,
        "shrine keeper at Inari Shrine",
        "serious, traditional, gentle with children",
        ["shrines", "gardening", "tea"],
        "Inari Shrine",
        1000,
    ),
    (
        "Emi Yamada",
        38,
        "bookshop clerk",
        "thoughtful, quiet, recommends books to everyone",
        ["books", "kissaten", "cats"],
        "Hondana Books",
        1100,
    ),
    (
        "Takumi Sasaki",
        45,
        "station attendant",
        "friendly, cracks jokes, knows every train",
        ["trains", "ekiben", "izakaya"],
        "Pokomachi Station",
        1300,
    ),
    (
        "Nanami Matsumoto",
        74,
        "retired florist",
        "kind and nosy, feeds the park's pigeons",
        ["parks", "flowers", "gossip"],
        None,
        0,
    ),
    (
        "Riku Yoshida",
        27,
        "freelance illustrator",
        "dreamy and independent, sketches everywhere",
        ["cafe", "parks", "art"],
        None,
        0,
    ),
    (
        "Sakura Kato",
        33,
        "nurse",
        "caring and practical, always short of sleep",
        ["baths", "sweets", "quiet"],
        None,
        0,
    ),
]

_BACKGROUND = [
    "Moved to Pokomachi {years} years ago and still finds new corners of the town.",
    "Last week heard that Cafe Sora had live music and a long queue.",
    "Often greets the neighbours at {home} in the morning.",
]


@transaction.atomic
def demo_town_create(*, seed: int = 0, name: str = DEMO_TOWN_NAME) -> Town:
    """Build the demo town; TownError if a town of that name exists (delete it first)."""
    if Town.objects.filter(name=name).exists():
        raise TownError(
            f"a town named {name!r} exists already; run seed_town --replace to rebuild it"
        )
    rng = random.Random(seed)
    town = Town.objects.create(name=name, seed=seed)
    places = {}
    for name_en, name_ja, kind, about, x, y, opens, closes, capacity in PLACES:
        menu = [
            {"item": item, "price": price, "hunger": hunger, "energy": energy}
            for item, price, hunger, energy in MENUS.get(name_en, [])
        ]
        places[name_en] = Place.objects.create(
            town=town,
            name=name_en,
            name_ja=name_ja,
            kind=kind,
            description=about,
            x=x,
            y=y,
            opens_at=_minutes(opens),
            closes_at=_minutes(closes),
            capacity=capacity,
            menu=menu,
        )
    homes = [p for p in places.values() if p.is_home]
    chosen = sorted(rng.sample(range(len(RESIDENT_POOL)), NUM_DEMO_RESIDENTS))
    # Round-robin over the homes keeps every household within its home's capacity.
    home_order = rng.sample(range(NUM_DEMO_RESIDENTS), NUM_DEMO_RESIDENTS)
    for position, index in enumerate(chosen):
        name_en, age, occupation, personality, likes, workplace, wage = RESIDENT_POOL[index]
        home = homes[home_order[position] % len(homes)]
        familiar = rng.sample([p for p in places.values() if not p.is_home], 3)
        resident = Resident.objects.create(
            town=town,
            name=name_en,
            age=age,
            occupation=occupation,
            personality=personality,
            likes=likes,
            home=home,
            workplace=places[workplace] if workplace else None,
            wage_per_hour=wage,
            money=rng.randrange(2000, 15000, 100),
            hunger=rng.randrange(10, 50),
            energy=rng.randrange(55, 95),
            visits={str(home.id): 30, **{str(p.id): rng.randrange(1, 6) for p in familiar}},
        )
        for text in _BACKGROUND:
            Memory.objects.create(
                resident=resident, text=text.format(years=rng.randrange(1, 30), home=home.name)
            )
    return town


@transaction.atomic
def demo_town_replace(*, seed: int = 0, name: str = DEMO_TOWN_NAME) -> Town:
    """Delete the town of that name (with its runs) and build it again."""
    town = Town.objects.filter(name=name).first()
    if town is not None:
        town.runs.all().delete()
        Memory.objects.filter(resident__town=town).delete()
        town.residents.all().delete()
        town.delete()
    return demo_town_create(seed=seed, name=name)
