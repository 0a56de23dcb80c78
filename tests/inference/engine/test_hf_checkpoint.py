"""A llama checkpoint in Hugging Face format (safetensors) runs on the same llama module."""

import json

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.models.llama import LlamaConfig

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory, tiny_engine):
    """A tiny random llama saved by transformers, with SmolLM2's tokenizer and template."""
    path = tmp_path_factory.mktemp("tiny-llama-hf")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tiny_engine.tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(tiny_engine.tokenizer._backend.to_str())
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "bos_token": "<|im_start|>",
                "chat_template": tiny_engine.tokenizer.chat_template_source,
            }
        )
    )
    return path, model


def test_engine_matches_transformers_on_a_safetensors_checkpoint(hf_checkpoint):
    path, reference = hf_checkpoint
    engine = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=64))
    try:
        messages = [{"role": "user", "content": "町の朝、どこへ行く?"}]
        ids = engine.tokenizer.apply_chat_template(messages)
        out = engine.generate(messages, SamplingParams(max_tokens=16, temperature=0.0))[0]
        with torch.inference_mode():
            theirs = reference.generate(
                torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None
            )[0, len(ids) :].tolist()
        n = len(out.token_ids)
        assert out.token_ids == theirs[:n]
        assert n == 16 or out.finish_reason == "stop"
    finally:
        engine.shutdown()


def test_unsupported_checkpoints_say_why(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="model_type"):
        LLMEngine(EngineConfig(model=str(tmp_path)))
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaConfig.from_hf_config(
            dict(
                vocab_size=10,
                hidden_size=8,
                intermediate_size=8,
                num_hidden_layers=1,
                num_attention_heads=2,
                rope_scaling={"type": "llama3"},
            )
        )
