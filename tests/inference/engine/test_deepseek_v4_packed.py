"""DeepSeek-V4 held packed (models/packed, deepseek_v4.loader): a checkpoint in DeepSeek's layout
with FP8 linears and FP4 experts, written by the tests (deepseek_v4.packed_checkpoint), loads
streamed with its weights kept in their bytes; its greedy tokens equal transformers'
DeepseekV4ForCausalLM holding the dequantized values; the same model in transformers' names or
as save_pretrained writes it loads to the same values; bad checkpoints fail naming the tensor
before anything is read; expert-parallel ranks read only their experts; a mid-size checkpoint
loads within 2x its packed bytes of resident memory (3x at peak)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.models import load_model
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.held_bytes import held_bytes
from inference.engine.models.deepseek_v4.loader import Shard, index_checkpoint
from inference.engine.models.deepseek_v4.packed_checkpoint import write_packed_checkpoint
from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG
from inference.engine.models.packed.dequantized import dequantized_state_dict
from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.linear import Fp8GroupedLinear, Fp8Linear

CONFIG = {**TINY_CONFIG, "vocab_size": 512}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("packed-v4")
    write_packed_checkpoint(path, CONFIG, seed=1, max_shard_bytes=1 << 20)
    return path


@pytest.fixture(scope="module")
def loaded(packed):
    return load_model(str(packed), torch.device("cpu"))


@pytest.fixture(scope="module")
def reference(loaded):
    """transformers' model holding our model's dequantized values (its MTP layer is ours only)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DeepseekV4Config(**CONFIG)
    config._attn_implementation = "eager"
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    held = dequantized_state_dict(loaded.model)
    model.load_state_dict({k: v for k, v in held.items() if not k.startswith("mtp.")})
    return model


def _all_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return tensors


def _rewritten(source: Path, target: Path, tensors: dict[str, torch.Tensor]) -> Path:
    target.mkdir()
    (target / "config.json").write_text((source / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(target / "model.safetensors"))
    return target


def test_the_model_holds_the_checkpoint_packed(packed, loaded):
    attention = loaded.model.model.layers[1].self_attn
    assert isinstance(attention.q_a_proj, Fp8Linear)
    assert isinstance(attention.o_a_proj, Fp8GroupedLinear)
    assert isinstance(attention.compressor.indexer.q_b_proj, Fp8Linear)
    experts = loaded.model.model.layers[2].mlp.experts
    assert isinstance(experts, Fp4Experts) and experts.gate_up.dtype == torch.uint8
    assert experts.gate_up.shape == (8, 2 * 64, 128 // 2)
    assert loaded.tokenizer is None  # the written checkpoint has none
    bytes_on_disk = sum(f.stat().st_size for f in packed.glob("*.safetensors"))
    held = held_bytes(loaded.model)
    packed_on_disk = sum(
        t.numel() * t.element_size() for n, t in _all_tensors(packed).items() if ".experts." in n
    )
    assert held.experts == packed_on_disk  # FP4 bytes and e8m0 scales, as on disk
    # On the CPU only the small bf16 tensors are widened (to fp32): under 2x the files.
    assert bytes_on_disk < held.total < 2 * bytes_on_disk


def test_greedy_tokens_equal_transformers_cached_and_uncached(packed, reference):
    """The engine (prompts as token ids: the checkpoint has no tokenizer), a cold prompt and one
    resuming from the prefix cache, against transformers' generate with and without its cache."""
    rng = random.Random(0)
    head = [rng.randrange(512) for _ in range(140)]
    prompts = [head + [rng.randrange(512) for _ in range(9)] for _ in range(2)]
    engine = LLMEngine(EngineConfig(model=str(packed), num_kv_blocks=64, num_threads=1))
    try:
        outputs = [engine.generate(prompt, GREEDY)[0] for prompt in prompts]
    finally:
        engine.shutdown()
    assert outputs[1].metrics.num_cached_tokens > 0
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.text == ""
        for use_cache in (True, False):
            with torch.inference_mode():
                theirs = reference.generate(
                    torch.tensor([prompt]), max_new_tokens=8, do_sample=False, use_cache=use_cache
                )
            assert output.token_ids == theirs[0, len(prompt) :].tolist(), use_cache


def test_text_needs_a_tokenizer_and_says_so(packed):
    engine = LLMEngine(EngineConfig(model=str(packed), num_kv_blocks=32, num_threads=1))
    try:
        with pytest.raises(ValueError, match="no tokenizer"):
            engine.generate("hello", GREEDY)
        with pytest.raises(ValueError, match="no tokenizer"):
            engine.generate([1, 2, 3], SamplingParams(max_tokens=2, stop=["x"]))
        deltas = list(engine.generate_stream([5, 6, 7], GREEDY))
        assert sum(len(d.token_ids) for d in deltas[:-1]) == 8
    finally:
        engine.shutdown()


def test_transformers_names_and_save_pretrained_load_the_same_values(
    packed, loaded, reference, tmp_path
):
    """The same model saved in transformers' in-memory names (stacked experts, dense fp32) and
    by transformers' own save_pretrained (DeepSeek's names under `model.`, `head.weight`,
    `model.embed_tokens.weight`): both load to the values the packed checkpoint holds."""
    ours = {k: v for k, v in dequantized_state_dict(loaded.model).items()}
    stacked = _rewritten(packed, tmp_path / "stacked", ours)
    reference.save_pretrained(tmp_path / "saved")
    saved_names = set(_all_tensors(tmp_path / "saved"))
    assert "model.layers.0.attn.wq_a.weight" in saved_names and "head.weight" in saved_names
    for path in (stacked, tmp_path / "saved"):
        held = dequantized_state_dict(load_model(str(path), torch.device("cpu")).model)
        for name, tensor in held.items():
            if path.name == "saved" and name.startswith("mtp."):
                continue
            assert torch.equal(tensor, ours[name]), (path.name, name)


def _broken(packed: Path, tmp_path: Path, change) -> Path:
    tensors = _all_tensors(packed)
    change(tensors)
    return _rewritten(packed, tmp_path / "broken", tensors)


@pytest.mark.parametrize(
    "change, message",
    [
        (  # a scale grid for 2 x 1 blocks where the weight has 1 x 1
            lambda t: t.__setitem__("layers.1.attn.wq_a.scale", torch.ones(2, 1)),
            r"layers\.1\.attn\.wq_a\.weight: its scale grid \(2, 1\) does not divide",
        ),
        (
            lambda t: t.pop("layers.3.attn.wkv.scale"),
            r"layers\.3\.attn\.wkv\.weight is packed .* no scale for it: expected "
            r"layers\.3\.attn\.wkv\.scale",
        ),
        (  # 63 bytes a row: 126 FP4 inputs, not a whole number of 32-input groups
            lambda t: t.__setitem__(
                "layers.2.ffn.experts.5.w2.weight", torch.zeros(128, 63, dtype=torch.uint8)
            ),
            r"layers\.2\.ffn\.experts\.5\.w2\.weight: 126 FP4 inputs a row \(63 bytes\)",
        ),
        (
            lambda t: t.pop("layers.4.ffn.experts.7.w3.weight"),
            r"layers\.4\.ffn\.experts\.7\.w3\.scale: a scale whose weight .* is not in",
        ),
        (
            lambda t: [t.pop(f"layers.4.ffn.experts.7.w3.{leaf}") for leaf in ("weight", "scale")],
            r"model\.layers\.4\.mlp\.experts: the checkpoint lacks 1 expert projections",
        ),
    ],
)
def test_a_bad_checkpoint_fails_naming_the_tensor_before_reading_any(
    packed, tmp_path, change, message
):
    path = _broken(packed, tmp_path, change)
    config = DeepseekV4Config.from_hf_config(CONFIG)
    with pytest.raises(ValueError, match=message):
        index_checkpoint(path, config)  # the headers alone
    with pytest.raises(ValueError, match=message):
        LLMEngine(EngineConfig(model=str(path), num_kv_blocks=32, num_threads=1))


def test_expert_parallel_ranks_read_only_their_experts(packed, loaded):
    full = loaded.model.model.layers
    per_rank = []
    for rank in range(2):
        model = load_model(str(packed), torch.device("cpu"), shard=Shard(rank, 2)).model
        layers = model.model.layers
        assert [layer.mlp.experts.expert_ids for layer in layers] == [
            range(4 * rank, 4 + 4 * rank)
        ] * len(layers)
        for mine, whole in zip(layers, full, strict=True):
            lo = 4 * rank
            assert torch.equal(mine.mlp.experts.gate_up, whole.mlp.experts.gate_up[lo : lo + 4])
            assert torch.equal(
                mine.mlp.experts.down_scale, whole.mlp.experts.down_scale[lo : lo + 4]
            )
        per_rank.append(sum(held_bytes(layer.mlp.experts).experts for layer in layers))
    whole_bytes = sum(held_bytes(layer.mlp.experts).experts for layer in full)
    assert per_rank == [whole_bytes // 2] * 2


def test_two_ranks_give_the_same_tokens(packed):
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(20, 90))] for _ in range(3)]
    outputs = []
    for parallel in ({}, dict(tensor_parallel_size=2, enable_expert_parallel=True)):
        engine = LLMEngine(
            EngineConfig(
                model=str(packed),
                num_kv_blocks=64,
                num_threads=1,
                distributed_timeout_s=60.0,
                **parallel,
            )
        )
        try:
            outputs.append([o.token_ids for o in engine.generate(prompts, GREEDY)])
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]


def test_a_mid_size_checkpoint_loads_within_2x_its_packed_bytes(mid_v4_checkpoint):
    """0.43 GB packed (3.4 GB as fp32), loaded in a fresh process: resident memory grows by at
    most 2x the packed bytes on disk, and its peak by at most 3x."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "load-checkpoint", str(mid_v4_checkpoint)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    packed_kib = measured["packed_bytes"] / 1024
    assert measured["packed_bytes"] > 300e6
    assert measured["rss_after_kib"] - measured["rss_before_kib"] <= 2 * packed_kib
    assert measured["hwm_kib"] - measured["rss_before_kib"] <= 3 * packed_kib
    held = measured["held"]
    assert held["experts"] > 0.8 * measured["packed_bytes"]
