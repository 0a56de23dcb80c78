"""Prompt layouts, measured with the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import pytest

from tests.town.factories import run_factory
from town.rules.prompts import LAYOUTS, prompt_build
from town.selectors import world_load


def _common_prefix_len(sequences: list[list[int]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences):
            return i
    return n


def _tick_prompts(run, tick_index: int = 0):
    world = world_load(run=run, tick_index=tick_index)
    return world, [
        prompt_build(world=world, resident=r, layout=run.layout) for r in world.residents
    ]


SHARED_LAYOUTS = [
    "shared_rules",
    "shared_head",
    "shared_head_schema_only",
    "shared_then_resident_head",
]
# The shared head's share of a prompt: `shared_rules` keeps the menus per resident (the talk's
# step before the shops' table moved up); `shared_then_resident_head` leaves the tick's
# situation out of the shared head (it goes after the resident's own, cached head).
MIN_SHARE = {"shared_rules": 0.35, "shared_then_resident_head": 0.5}


@pytest.mark.parametrize("layout", SHARED_LAYOUTS)
def test_shared_head_is_the_same_token_sequence_for_every_resident(
    demo_town, smollm2_tokenizer, layout
):
    run = run_factory(town=demo_town, layout=layout)
    world, prompts = _tick_prompts(run)
    assert len(prompts) == len(world.residents) == 10
    tokens = [smollm2_tokenizer.apply_chat_template(p.messages) for p in prompts]
    heads = [
        smollm2_tokenizer.apply_chat_template(p.head_messages, add_generation_prompt=False)
        for p in prompts
    ]
    # The head (everything up to the last cache breakpoint) is one sequence for all residents…
    assert all(head == heads[0] for head in heads)
    assert len({p.head_hash for p in prompts}) == 1
    # …and every full prompt starts with exactly it.
    head_len = len(heads[0])
    assert all(t[:head_len] == heads[0] for t in tokens)
    common = _common_prefix_len(tokens)
    assert head_len <= common < min(len(t) for t in tokens)
    # Town-shaped prompts: most of each prompt is the shared head, once the shops' table is
    # in it (`shared_rules` keeps the menus per resident: the talk's step before that).
    assert head_len >= 500 and all(800 <= len(t) <= 3000 for t in tokens)
    share = head_len / (sum(map(len, tokens)) / len(tokens))
    assert share > MIN_SHARE.get(layout, 0.6)
    print(
        f"\n{layout}: shared head {head_len} tokens, common prefix {common}, prompts "
        f"{min(map(len, tokens))}..{max(map(len, tokens))} tokens"
    )


def test_first_shared_section_is_the_same_in_every_tick(demo_town, smollm2_tokenizer):
    run = run_factory(town=demo_town, layout="shared_head")
    first = _tick_prompts(run, 0)[1][0].messages[0]
    later = _tick_prompts(run, 5)[1][3].messages[0]
    assert first == later and first["cache"] is True
    tick_section_0 = _tick_prompts(run, 0)[1][0].messages[1]["content"]
    tick_section_5 = _tick_prompts(run, 5)[1][0].messages[1]["content"]
    assert tick_section_0 != tick_section_5  # the clock moved


@pytest.mark.parametrize("layout", ["shared_head", "shared_then_resident_head"])
def test_nothing_per_resident_leaks_into_the_shared_sections(demo_town, layout):
    run = run_factory(town=demo_town, layout=layout, diary_chars=600)
    world, prompts = _tick_prompts(run)
    for resident, prompt in zip(world.residents, prompts, strict=True):
        head_text = "\n".join(m["content"] for m in prompt.head_messages)
        tail = prompt.messages[len(prompt.head_messages) :]
        assert tail[-1]["role"] == "user"
        assert str(resident.money) not in head_text
        assert resident.personality not in head_text
        assert resident.diary[0] not in head_text
        if layout == "shared_then_resident_head":  # who is where comes after the own head
            assert all(r.name not in head_text for r in world.residents)
        assert resident.name in tail[0]["content"]


def test_the_residents_own_head_is_the_same_in_every_tick_and_its_own(demo_town, smollm2_tokenizer):
    """`shared_then_resident_head`: shared head, then the resident's own head (profile and
    diary, a breakpoint of scope "resident"), then what changes per tick. A resident's prompt
    in a later tick starts with exactly their earlier one's two heads."""
    run = run_factory(town=demo_town, layout="shared_then_resident_head", diary_chars=1500)
    world, first = _tick_prompts(run, 0)
    _, later = _tick_prompts(run, 5)
    for resident, a, b in zip(world.residents, first, later, strict=True):
        assert [m.get("scope") for m in a.messages] == [None, "resident", None]
        assert [bool(m.get("cache")) for m in a.messages] == [True, True, False]
        assert len(a.head_messages) == 1 and a.head_hash == b.head_hash
        own = a.messages[1]["content"]
        assert own == b.messages[1]["content"]
        assert resident.personality in own and resident.diary[-1] in own
        assert str(resident.money) not in own and "Now:" not in own
        assert "Now:" in a.messages[2]["content"] and a.messages[2] != b.messages[2]
        heads = smollm2_tokenizer.apply_chat_template(a.messages[:2], add_generation_prompt=False)
        assert smollm2_tokenizer.apply_chat_template(b.messages)[: len(heads)] == heads
    owns = {p.messages[1]["content"] for p in first}
    assert len(owns) == len(first)  # one own head per resident
    assert all("Answer with one JSON object" not in m["content"] for m in first[0].messages)


def test_naive_prompts_share_almost_nothing(demo_town, smollm2_tokenizer):
    run = run_factory(town=demo_town, layout="naive")
    _, prompts = _tick_prompts(run)
    assert all(p.head_messages == [] and p.head_hash == "" for p in prompts)
    tokens = [smollm2_tokenizer.apply_chat_template(p.messages) for p in prompts]
    common = _common_prefix_len(tokens)
    assert common < 32  # the chat template's opening and "You are", then the name differs
    print(f"\nnaive: common prefix {common} tokens, prompts {min(map(len, tokens))} tokens+")


def test_schema_only_layout_drops_the_format_from_the_body(demo_town, smollm2_tokenizer):
    with_format = run_factory(town=demo_town, layout="shared_head")
    schema_only = run_factory(town=demo_town, layout="shared_head_schema_only")
    a = _tick_prompts(with_format)[1][0]
    b = _tick_prompts(schema_only)[1][0]
    assert "Answer with one JSON object" in a.messages[0]["content"]
    assert "Answer with one JSON object" not in "".join(m["content"] for m in b.messages)
    assert a.json_schema == b.json_schema
    len_a = len(smollm2_tokenizer.apply_chat_template(a.messages))
    len_b = len(smollm2_tokenizer.apply_chat_template(b.messages))
    assert len_b < len_a


def test_unknown_layout_is_refused(demo_town):
    run = run_factory(town=demo_town)
    world = world_load(run=run, tick_index=0)
    with pytest.raises(ValueError, match="unknown prompt layout 'fancy'"):
        prompt_build(world=world, resident=world.residents[0], layout="fancy")
    assert set(LAYOUTS) == {"naive", *SHARED_LAYOUTS}
