"""The real SmolLM2 against transformers' GGUF-loaded model: logits and greedy output."""

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.attention.torch_metadata import TorchAttentionMetadata, plan_span

pytestmark = pytest.mark.real_model

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer briefly."}],
    [
        {
            "role": "system",
            "content": "You live in Pokomachi, a small town with a café and a shrine.",
        },
        {"role": "user", "content": "It is 8 am. Where do you go first, and why?"},
    ],
    [
        {"role": "user", "content": "Name three fruits."},
        {"role": "assistant", "content": "Apple, banana, cherry."},
        {"role": "user", "content": "Now three colours, in Japanese too: 赤, 青..."},
    ],
]


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name, dtype=torch.float32
    )
    return model.eval()


def engine_last_logits(engine, token_ids: list[int]) -> torch.Tensor:
    """One forward pass of the engine's model over fresh slots, as the runner builds it."""
    runner = engine.runner
    n = len(token_ids)
    slots = torch.arange(n)  # the test owns the cache here: nothing else runs
    meta = TorchAttentionMetadata(slots, [plan_span(0, n, [], 0, 16, slots.device)])
    return runner.model(
        torch.tensor(token_ids), torch.arange(n), runner.kv_caches, meta, torch.tensor([n - 1])
    )[0]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_last_position_logits_match_transformers(smollm2_engine, hf_model, messages):
    ids = smollm2_engine.tokenizer.apply_chat_template(messages)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([ids])).logits[0, -1]
    with smollm2_engine._lock:  # keep the engine loop off the cache while we use it
        ours = engine_last_logits(smollm2_engine, ids)
    relative = (ours - reference).abs().max() / reference.abs().max()
    assert relative < 1e-3


# Longer than the engine's 512-token step budget: prefilled in chunks over the paged cache.
LONG_CONVERSATION = [
    {
        "role": "system",
        "content": "Town rules. " + "Every shop opens at nine and closes at six. " * 60,
    },
    {"role": "user", "content": "It is noon. Which shop do you visit, and why?"},
]


def test_greedy_output_matches_transformers_for_at_least_16_tokens(smollm2_engine, hf_model):
    assert len(smollm2_engine.tokenizer.apply_chat_template(LONG_CONVERSATION)) > 512
    for messages in [*CONVERSATIONS, LONG_CONVERSATION]:
        ids = smollm2_engine.tokenizer.apply_chat_template(messages)
        ours = smollm2_engine.generate(ids, SamplingParams(max_tokens=20, temperature=0.0))[0]
        with torch.inference_mode():
            theirs = hf_model.generate(
                torch.tensor([ids]), max_new_tokens=20, do_sample=False, attention_mask=None
            )[0, len(ids) :].tolist()
        n = max(16, len(ours.token_ids)) if ours.finish_reason == "length" else len(ours.token_ids)
        assert ours.token_ids[:n] == theirs[:n]
