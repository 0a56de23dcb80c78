"""The real Gemma 3 270M against transformers' GGUF-loaded model (fp32), on prompts longer
than the 512-token window: logits at positions on both sides of the window, and through the
engine's chunked prefill, logits of every step and the greedy output."""

from __future__ import annotations

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.attention.torch_metadata import TorchAttentionMetadata, plan_span
from inference.engine.loading.model_files import gguf_path_for

pytestmark = pytest.mark.real_model

PLACES = ["bakery", "shrine", "café", "library", "park", "station", "fish market", "bathhouse"]
# Two long prompts (≈1,300 and ≈1,250 tokens), English and Japanese mixed as the town's are.
PROMPTS = [
    "\n".join(
        f"Resident {i} wakes at {6 + i % 4}:{(i * 7) % 60:02d}, walks from the {PLACES[i % 8]} "
        f"to the {PLACES[(i * 3 + 1) % 8]}, and says 「おはようございます」 to a neighbour."
        for i in range(40)
    )
    + "\nQuestion: where does resident 7 go after breakfast? Answer:",
    "Town rules of Pokomachi.\n"
    + "".join(
        f"{i + 1}. The {PLACES[i % 8]} opens at {7 + i % 5} and closes at {17 + i % 4}; "
        f"{PLACES[(i + 2) % 8]}の前では静かにすること。\n"
        for i in range(50)
    )
    + "Summary of the rules in one sentence:",
]
NUM_TOKENS = 20


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    path = gguf_path_for("gemma3-270m")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def engine():
    # A 512-token step budget: every prompt here is prefilled in three chunks.
    engine = LLMEngine(
        EngineConfig(model="gemma3-270m", num_kv_blocks=256, max_num_batched_tokens=512)
    )
    yield engine
    engine.shutdown()


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def test_prompts_are_longer_than_the_window(engine):
    for prompt in PROMPTS:
        assert len(engine.tokenizer.encode(prompt, add_special_tokens=True)) >= 1200


def test_logits_match_transformers_on_both_sides_of_the_window(engine, hf_model):
    ids = engine.tokenizer.encode(PROMPTS[0], add_special_tokens=True)
    n = len(ids)
    rows = torch.tensor([0, 300, 511, 512, 513, 900, n - 1])
    with torch.inference_mode():
        reference = hf_model(torch.tensor([ids])).logits[0, rows]
    config = engine.runner.model.config
    shape = (n, config.num_kv_heads, config.head_dim)
    # One span over fresh caches of n slots: the engine's own cache is left alone.
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
    meta = TorchAttentionMetadata(
        torch.arange(n), [plan_span(0, n, [], 0, 16, torch.device("cpu"))]
    )
    with engine._lock:  # keep the engine loop off the model while we borrow it
        ours = engine.runner.model(torch.tensor(ids), torch.arange(n), caches, meta, rows)
    for row, (o, r) in enumerate(zip(ours, reference, strict=True)):
        assert relative_error(o, r) < 1e-3, f"position {int(rows[row])}"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chunked_prefill_and_decode_match_transformers(engine, hf_model, prompt):
    """Through the engine (prefill in 512-token chunks, then decode): the logits of every
    sampled step within 1e-3 of transformers', and the same greedy tokens."""
    captured: list[torch.Tensor] = []

    def keep_sampled_logits(module, inputs, logits):
        if logits.shape[0]:  # steps that end a prompt chunk mid-way sample nothing
            captured.append(logits[0].clone())

    hook = engine.runner.model.register_forward_hook(keep_sampled_logits)
    try:
        ours = engine.generate(prompt, SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0))[0]
    finally:
        hook.remove()
    ids = ours.prompt_token_ids
    with torch.inference_mode():
        theirs = hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=NUM_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    their_tokens = theirs.sequences[0, len(ids) :].tolist()
    assert ours.token_ids == their_tokens[: len(ours.token_ids)]
    assert len(ours.token_ids) >= 16 or ours.finish_reason == "stop"
    assert len(captured) == len(ours.token_ids)
    for step, (o, r) in enumerate(zip(captured, theirs.logits, strict=False)):
        assert relative_error(o, r[0]) < 1e-3, f"step {step}"
