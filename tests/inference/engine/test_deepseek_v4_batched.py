"""DeepSeek-V4's batched step on ragged batches (deepseek-v4-tiny-random, fp32 on CPU): one
attention call for all of a step's sequences equals the per-sequence reference
(v4_attention_reference.py) for a prefill chunk, decodes mid-window, at a CSA window's close and
at the first HCA window's, and a chunk closing two; the grouped experts equal a loop over experts,
dense and FP4, whole or one rank's share; the engine's greedy tokens at 8 in flight are those at
1; a sequence whose blocks do not hold its span is refused naming it."""

from __future__ import annotations

import random

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.models import grouped_experts, load_model
from inference.engine.models.deepseek_v4 import attention
from inference.engine.models.deepseek_v4.attention import Attention
from inference.engine.models.deepseek_v4.state import SequenceState
from inference.engine.models.deepseek_v4.step_tables import StepTables
from inference.engine.models.deepseek_v4.tiny import NAME
from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.formats import quantize_fp4
from tests.inference.engine.helpers import smollm2_tokens
from tests.inference.engine.v4_attention_reference import reference_forward

BLOCK = 16
# (tokens before the step, tokens in it) per sequence.
STEP = [(0, 37), (127, 1), (130, 1), (7, 1), (60, 9)]
BLOCKS_EACH = -(-max(a + b for a, b in STEP) // BLOCK)


@pytest.fixture(scope="module")
def model():
    return load_model(NAME, torch.device("cpu")).model


def _spans(parts: list[tuple[int, int, int]]) -> tuple[GroupSpans, GroupSpans]:
    """(sequence, start, length) parts of one step, each sequence in blocks of its own."""
    slots, spans, query_start = [], [], 0
    for seq, start, length in parts:
        blocks = list(range(seq * BLOCKS_EACH, (seq + 1) * BLOCKS_EACH))
        slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + length)]
        spans.append(ScheduledSpan(query_start, length, start, blocks))
        query_start += length
    return GroupSpans(slots, spans), GroupSpans(list(slots), spans)


def _run(model, state, prompts, parts, rows=None) -> torch.Tensor:
    """The step's logits at `rows` (every row's by default)."""
    full, window = _spans(parts)
    spec = model.config.paged_state_spec()
    meta = spec.metadata_builder(BLOCK, torch.device("cpu")).build(full, window)
    ids = [t for seq, start, n in parts for t in prompts[seq][start : start + n]]
    positions = [p for _, start, n in parts for p in range(start, start + n)]
    rows = torch.arange(len(ids)) if rows is None else rows
    return model(torch.tensor(ids), torch.tensor(positions), state.layers, meta, rows)


def _stepped_state(model, prompts):
    """A fresh state holding each sequence's history, written one sequence at a time."""
    num = len(STEP) * BLOCKS_EACH
    state = model.config.paged_state_spec().allocate(
        num, num, BLOCK, torch.float32, torch.device("cpu")
    )
    for seq, (start, _) in enumerate(STEP):
        if start:
            _run(model, state, prompts, [(seq, 0, start)])
    return state


def test_batched_attention_equals_the_per_sequence_reference(model, monkeypatch):
    """Query chunks of 16 (smaller than the default's, which takes this step whole) that
    straddle sequences: the chunking is exercised too."""
    monkeypatch.setattr(attention, "GATHER_BUDGET", 16 * (128 + 40) * 64)
    rng = random.Random(5)
    prompts = [smollm2_tokens(rng, start + n) for start, n in STEP]
    step = [(seq, start, n) for seq, (start, n) in enumerate(STEP)]
    batched_state = _stepped_state(model, prompts)
    batched = _run(model, batched_state, prompts, step)
    reference_state = _stepped_state(model, prompts)
    monkeypatch.setattr(Attention, "forward", reference_forward)
    reference = _run(model, reference_state, prompts, step)
    assert float((batched - reference).abs().max() / reference.abs().max()) < 1e-4
    assert torch.equal(batched.argmax(-1), reference.argmax(-1))
    for name in ("window", "csa_entries", "csa_index_entries", "hca_entries"):
        ours, theirs = getattr(batched_state, name), getattr(reference_state, name)
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5, msg=name)
    assert batched_state.hca_entries.abs().sum() > 0  # the step closed HCA windows


def test_the_last_layer_runs_only_the_rows_whose_logits_are_asked(model):
    """The last layer's queries, mix and MoE run for the logits' rows alone: those rows' logits
    are the ones every row's pass gives, no row gives none, and the state every later step reads
    is written for every token either way (the kernel path's:
    kernels/test_v4_model_kernels.py)."""
    rng = random.Random(6)
    prompts = [smollm2_tokens(rng, start + n) for start, n in STEP]
    step = [(seq, start, n) for seq, (start, n) in enumerate(STEP)]
    every_state, some_state, none_state = (_stepped_state(model, prompts) for _ in range(3))
    num_rows = sum(n for _, _, n in step)
    wanted = torch.tensor([0, 36, 37, 40, num_rows - 1])  # some of a prefill's, a decode's
    every = _run(model, every_state, prompts, step)
    some = _run(model, some_state, prompts, step, wanted)
    none = _run(model, none_state, prompts, step, wanted[:0])
    assert some.shape == (len(wanted), every.shape[1]) and none.shape == (0, every.shape[1])
    torch.testing.assert_close(some, every[wanted], rtol=1e-4, atol=1e-4)
    for layers in (some_state.layers, none_state.layers):
        for ours, theirs in zip(layers, every_state.layers, strict=True):
            torch.testing.assert_close(ours.window, theirs.window)


def _loop_reference(x, indices, weights, gate_up, down, expert_ids, limit):
    """The weighted sum over each token's experts held, one expert at a time."""
    out = torch.zeros(x.shape)
    for expert in indices.unique().tolist():
        if expert not in expert_ids:
            continue
        local = expert - expert_ids.start
        tokens, slot = torch.where(indices == expert)
        gate, up = torch.nn.functional.linear(x[tokens], gate_up[local]).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
        h = torch.nn.functional.linear(h, down[local]) * weights[tokens, slot, None]
        out.index_add_(0, tokens, h)
    return out


# Dense experts grouped (padded to one batch, or expert by expert on their sorted rows) or
# every expert on every token; packed ones are always grouped.
@pytest.mark.parametrize(
    ("packed", "dense", "padded"),
    [(False, False, True), (False, False, False), (False, True, True), (True, False, True)],
    ids=["grouped", "expert-by-expert", "dense", "fp4"],
)
@pytest.mark.parametrize("share", [None, range(2, 5)])
# Some experts never hit, every one, or two far apart (the experts hit copied out, not a view
# of their span).
@pytest.mark.parametrize("routed", [range(6), range(8), (0, 7)], ids=["6", "8", "0-and-7"])
def test_grouped_experts_equal_a_loop_over_experts(
    model, monkeypatch, packed, share, routed, dense, padded
):
    """Chunks of 3 experts (the default takes the tiny model's at once): the chunking too."""
    experts = model.model.layers[3].mlp.experts
    expert_size = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
    monkeypatch.setattr(grouped_experts, "WEIGHT_BUDGET", 3 * expert_size)
    monkeypatch.setattr(grouped_experts, "DENSE_WASTE_BUDGET", 1 << 40 if dense else -1)
    monkeypatch.setattr(grouped_experts, "PADDING_WASTE_BUDGET", 1 << 40 if padded else -1)
    generator = torch.Generator().manual_seed(len(routed))
    num_tokens = 11
    x = torch.randn(num_tokens, experts.gate_up_proj.shape[2], generator=generator)
    routed = torch.tensor(list(routed))
    indices = torch.stack(
        [routed[torch.randperm(len(routed), generator=generator)[:2]] for _ in range(num_tokens)]
    )
    weights = torch.rand(num_tokens, 2, generator=generator)
    gate_up, down = experts.gate_up_proj.data, experts.down_proj.data
    if packed:
        intermediate = down.shape[2]
        fp4 = Fp4Experts(down.shape[1], intermediate, experts.limit, experts.expert_ids)
        fp4.gate_up, fp4.gate_up_scale = quantize_fp4(gate_up)
        fp4.down, fp4.down_scale = quantize_fp4(down)
        experts = fp4
        gate_up, down = fp4.dequantized()
    held = experts.expert_ids
    if share is not None:
        experts = experts.sliced(share)
        gate_up, down, held = (
            gate_up[share.start : share.stop],
            down[share.start : share.stop],
            share,
        )
    ours = experts(x, indices, weights)
    theirs = _loop_reference(x, indices, weights, gate_up, down, held, experts.limit)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_greedy_tokens_at_eight_in_flight_are_those_at_one(make_v4_engine):
    engine = make_v4_engine(max_num_seqs=8)
    rng = random.Random(8)
    prompts = [smollm2_tokens(rng, n) for n in (5, 40, 126, 128, 131, 63, 200, 17)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    alone = [engine.generate(p, params)[0].token_ids for p in prompts]
    together = [o.token_ids for o in engine.generate(prompts, params)]
    assert together == alone


def test_a_sequence_whose_blocks_miss_its_span_is_refused_naming_it():
    spans = [
        SequenceState(0, 1, 40, [0, 1, 2], [0, 1, 2], 0),
        SequenceState(1, 1, 40, [3, 4, 5], [3], 0),  # its window blocks end at token 16
    ]
    tables = StepTables.build(spans, BLOCK, BLOCK // 4, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="sequence 1 of the step reads position"):
        tables.window_keys()
