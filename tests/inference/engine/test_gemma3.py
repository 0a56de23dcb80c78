"""The gemma3 architecture on its tiny random-weight variant: config from the real GGUF
metadata, weight-name mapping, and the engine (paged, chunked, windowed) against one plain
forward pass of the same model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.attention.torch_metadata import TorchAttentionMetadata, plan_span
from inference.engine.loading.gguf_file import open_gguf, read_metadata
from inference.engine.loading.model_files import gguf_path_for, known_model_names
from inference.engine.models import gemma3
from inference.engine.models.gemma3 import Gemma3Config, _layer_types, gguf_names_to_hf


@pytest.fixture(scope="module")
def gemma3_metadata():
    return read_metadata(open_gguf(gguf_path_for("gemma3-270m")))


@pytest.fixture(scope="module")
def tiny_gemma():
    # 64-token steps: a 700-token prompt is prefilled in 11 chunks across the 512 window.
    engine = LLMEngine(
        EngineConfig(model="gemma3-tiny-random", num_kv_blocks=128, max_num_batched_tokens=64)
    )
    yield engine
    engine.shutdown()


def test_config_comes_from_the_gguf_metadata(gemma3_metadata):
    config = Gemma3Config.from_gguf_metadata(gemma3_metadata, vocab_size=262144)
    assert config.num_layers == 18
    assert [i for i, t in enumerate(config.layer_types) if t == "full"] == [5, 11, 17]
    assert config.sliding_window == 512
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 1, 256)
    assert config.query_pre_attn_scalar == 256
    assert config.kv_bytes_per_token == 18 * config.kv_bytes_per_token_per_layer == 18 * 2048


def test_layer_pattern_from_a_period_or_a_per_layer_list():
    assert _layer_types(None, 7) == ("sliding",) * 5 + ("full", "sliding")
    assert _layer_types(2, 4) == ("sliding", "full", "sliding", "full")
    assert _layer_types([True, False], 2) == ("sliding", "full")
    with pytest.raises(ValueError, match="3 entries, not 2"):
        _layer_types([True, True, False], 2)


def test_config_rejects_inconsistent_layer_types(gemma3_metadata):
    config = Gemma3Config.from_gguf_metadata(gemma3_metadata, vocab_size=262144)
    with pytest.raises(ValueError, match="layer_types has 2 entries for 18 layers"):
        dataclasses.replace(config, layer_types=("full", "sliding"))
    with pytest.raises(ValueError, match="must be among"):
        dataclasses.replace(config, layer_types=("local",) * 18)
    with pytest.raises(ValueError, match="need a sliding_window"):
        dataclasses.replace(config, sliding_window=None)


def test_gguf_norms_lose_the_plus_one_llama_cpp_folds_in():
    tensors = {
        "token_embd.weight": torch.zeros(3, 2),
        "output_norm.weight": torch.tensor([1.5, 2.0]),
        "blk.0.attn_q_norm.weight": torch.tensor([1.25]),
        "blk.0.post_ffw_norm.weight": torch.tensor([0.5]),
        "blk.0.attn_q.weight": torch.tensor([[1.0]]),
    }
    hf = gguf_names_to_hf(tensors, None)
    assert hf["model.norm.weight"].tolist() == [0.5, 1.0]
    assert hf["model.layers.0.self_attn.q_norm.weight"].tolist() == [0.25]
    assert hf["model.layers.0.post_feedforward_layernorm.weight"].tolist() == [-0.5]
    assert hf["model.layers.0.self_attn.q_proj.weight"].tolist() == [[1.0]]  # not a norm


def test_tiny_variant_is_one_period_of_the_real_pattern(tiny_gemma):
    config = tiny_gemma.runner.model.config
    assert "gemma3-tiny-random" in known_model_names()
    assert config.layer_types == ("sliding",) * 5 + ("full",)
    assert config.sliding_window == 512
    assert config.vocab_size == 262144
    assert tiny_gemma.tokenizer.encode("hi", add_special_tokens=True)[0] == 2  # <bos>


def _single_pass_greedy(model, ids: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding by re-running the whole sequence in one span over fresh slots."""
    config = model.config
    ids = list(ids)
    out = []
    for _ in range(num_tokens):
        n = len(ids)
        shape = (n, config.num_kv_heads, config.head_dim)
        caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
        meta = TorchAttentionMetadata(
            torch.arange(n), [plan_span(0, n, [], 0, 16, torch.device("cpu"))]
        )
        logits = model(torch.tensor(ids), torch.arange(n), caches, meta, torch.tensor([n - 1]))
        out.append(int(logits[0].argmax()))
        ids.append(out[-1])
    return out


def test_engine_matches_a_single_pass_past_the_window(tiny_gemma):
    prompt = " ".join(f"resident {i} visits the bakery" for i in range(120))
    ids = tiny_gemma.tokenizer.encode(prompt, add_special_tokens=True)
    assert len(ids) > 600  # longer than the 512 window, so sliding layers drop keys
    ours = tiny_gemma.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert ours.prompt_token_ids == ids
    with tiny_gemma._lock:  # keep the engine loop away while we borrow its model
        expected = _single_pass_greedy(tiny_gemma.runner.model, ids, 6)
    assert ours.token_ids == expected


def test_the_window_changes_the_output(tiny_gemma):
    """The comparison above means something only if the window matters for this prompt."""
    model = tiny_gemma.runner.model
    ids = tiny_gemma.tokenizer.encode("the town square " * 200, add_special_tokens=True)
    n = len(ids)
    meta = TorchAttentionMetadata(
        torch.arange(n), [plan_span(0, n, [], 0, 16, torch.device("cpu"))]
    )

    def last_logits():
        caches = [(torch.zeros(n, 2, 16), torch.zeros(n, 2, 16)) for _ in range(len(model.layers))]
        return model(torch.tensor(ids), torch.arange(n), caches, meta, torch.tensor([n - 1]))

    with tiny_gemma._lock:
        windowed = last_logits()
        attns = [layer.self_attn for layer in model.layers if layer.self_attn.is_sliding]
        try:
            for attn in attns:
                attn.window = None
            unwindowed = last_logits()
        finally:
            for attn in attns:
                attn.window = 512
    assert not torch.allclose(windowed, unwindowed, atol=1e-4)


def test_chat_messages_use_gemmas_turn_format_when_the_gguf_has_no_template(tiny_gemma):
    messages = [
        {"role": "system", "content": "Rules of the town."},
        {"role": "user", "content": "Where do you go?"},
    ]
    tokenizer = tiny_gemma.tokenizer
    assert tokenizer.render_chat(messages) == (
        "<bos><start_of_turn>user\nRules of the town.<end_of_turn>\n"
        "<start_of_turn>user\nWhere do you go?<end_of_turn>\n<start_of_turn>model\n"
    )
    # A prefix of the messages renders to a prefix of the tokens (what prefix caching needs).
    head = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=False)
    assert tokenizer.apply_chat_template(messages)[: len(head)] == head
    out = tiny_gemma.generate(messages, SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) >= 1


def test_sliding_layers_read_their_own_metadata_when_given():
    """A sliding layer writes and reads through meta.sliding; a full layer never does."""
    cfg = gemma3.Gemma3Config(
        vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2,
        num_kv_heads=1, head_dim=4, rope_theta=1e6, rope_local_theta=1e4, rms_norm_eps=1e-6,
        max_position_embeddings=64, layer_types=("sliding", "full"), sliding_window=4,
        query_pre_attn_scalar=4.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = gemma3.Gemma3ForCausalLM(cfg).eval()
    n = 6
    # Full layer: slots 0..5 of a 6-slot cache; sliding layer: slots 10..15 of its own 16.
    meta = TorchAttentionMetadata(
        torch.arange(n),
        [plan_span(0, n, [], 0, 16, torch.device("cpu"))],
        sliding=TorchAttentionMetadata(
            torch.arange(10, 16), [plan_span(0, n, [], 0, 16, torch.device("cpu"))]
        ),
    )
    caches = [
        (torch.zeros(16, 1, 4), torch.zeros(16, 1, 4)),
        (torch.zeros(6, 1, 4), torch.zeros(6, 1, 4)),
    ]
    model(torch.arange(n), torch.arange(n), caches, meta, torch.tensor([n - 1]))
    assert caches[0][0][:10].abs().sum() == 0 and caches[0][0][10:].abs().sum() > 0
    assert caches[1][0].abs().sum() > 0


@pytest.mark.parametrize("seed", range(3))
def test_json_schema_decoding_over_the_sentencepiece_vocabulary(tiny_gemma, seed):
    """xgrammar reads Gemma's spellings ("▁" spaces, <0xNN> bytes): the output always parses."""
    schema = {
        "type": "object",
        "properties": {
            "target": {"type": "string", "enum": ["bakery", "パン屋", "神社"]},
            "reason": {"type": "string", "maxLength": 30},
        },
        "required": ["target", "reason"],
    }
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, json_schema=schema)
    out = tiny_gemma.generate("Where do you go? ", params)[0]
    assert out.finish_reason == "stop"
    decision = json.loads(out.text)
    assert decision["target"] in {"bakery", "パン屋", "神社"}
    assert len(decision["reason"]) <= 30
