"""The memory plan (inference/engine/memory_plan): V4 Flash on one and two 128 GiB nodes, its
JSON, unknown models, and the plan against what the engine actually allocates and holds."""

from __future__ import annotations

import json

import pytest
import torch

from inference.engine.config import EngineConfig
from inference.engine.core.llm_engine import LLMEngine
from inference.engine.memory_plan import Sharding, model_spec, plan_memory, weight_bytes
from inference.engine.memory_plan.__main__ import main
from inference.engine.memory_plan.weights import held_bytes

FLASH_TP2 = [
    "--model",
    "deepseek-v4-flash",
    "--tensor-parallel-size",
    "2",
    "--enable-expert-parallel",
    "--device-memory-gib",
    "128",
]
JSON_KEYS = {
    "weights_bytes_per_rank",
    "kv_bytes_per_token_per_rank",
    "kv_tokens_per_rank",
    "max_concurrent_requests",
    "fits",
}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_flash_fits_two_128_gib_nodes_with_room_for_four_talk_decisions(capsys):
    code, out, _ = run([*FLASH_TP2, "--json"], capsys)
    plan = json.loads(out)
    assert code == 0
    assert set(plan) >= JSON_KEYS
    assert plan["fits"] is True
    assert 60e9 <= plan["weights_bytes_per_rank"] <= 90e9
    assert plan["max_concurrent_requests"] >= 4
    assert plan["kv_tokens_per_rank"] >= 4 * (12_310 + 51)
    by_kind = plan["weights_bytes_by_kind"]
    assert by_kind["experts"] > 0.85 * plan["weights_bytes_per_rank"]  # FP4 experts dominate


def test_flash_does_not_fit_one_node_and_says_why(capsys):
    code, out, _ = run([*FLASH_TP2[:2], "--device-memory-gib", "128"], capsys)
    assert code == 1
    assert "fits: no" in out
    assert "weights alone do not fit" in out
    assert "short by" in out
    code, out, _ = run([*FLASH_TP2[:2], "--device-memory-gib", "128", "--json"], capsys)
    plan = json.loads(out)
    assert plan["fits"] is False
    assert plan["shortfall_bytes"] > 0
    assert plan["weights_bytes_per_rank"] > 128 * 2**30


def test_expert_parallel_ranks_share_the_experts():
    spec = model_spec("deepseek-v4-flash")
    whole = weight_bytes(spec, torch.bfloat16, Sharding())
    ranks = [weight_bytes(spec, torch.bfloat16, Sharding(2, True, rank)) for rank in (0, 1)]
    assert sum(r.experts for r in ranks) == whole.experts
    assert sum(r.embeddings for r in ranks) == whole.embeddings
    assert all(r.other == whole.other for r in ranks)  # attention, norms, mHC: replicated


def test_the_table_names_every_attention_kind(capsys):
    code, out, _ = run(FLASH_TP2, capsys)
    assert code == 0
    for kind in (
        "sliding window K=V",
        "CSA entries + indexer keys",
        "HCA entries",
        "per window checkpoint",
        "activation/runtime reserve",
        "talk-sized decisions at once",
    ):
        assert kind in out


def test_unknown_models_and_configs_are_named(capsys, tmp_path):
    code, _, err = run(["--model", "no-such-model", "--device-memory-gib", "8"], capsys)
    assert code == 2
    assert "no-such-model" in err and "deepseek-v4-flash" in err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    code, _, err = run(["--model", str(tmp_path), "--device-memory-gib", "8"], capsys)
    assert code == 2
    assert "model_type 'mamba'" in err


def test_engine_refuses_to_start_naming_the_shortfall():
    config = EngineConfig(model="smollm2-tiny-random", device_memory_bytes=256 << 20)
    with pytest.raises(ValueError, match=r"does not fit.*short by .*GiB"):
        LLMEngine(config)


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
def test_llama_kv_per_token_is_what_the_engine_allocates(kv_cache_dtype):
    engine = LLMEngine(
        EngineConfig(
            model="smollm2-tiny-random",
            kv_cache_memory_bytes=4 << 20,
            kv_cache_dtype=kv_cache_dtype,
        )
    )
    try:
        plan = engine.memory_plan
        cache = engine.runner.state.cache
        assert engine.num_blocks == plan.num_blocks
        per_token = cache.numel() * cache.element_size() / (engine.num_blocks * 16)
        assert plan.kv_bytes_per_token_per_rank == per_token
        assert sum(kind.bytes_per_token for kind in plan.kv.kinds) == per_token
        assert held_bytes(engine.runner.model) == plan.weights.total
    finally:
        engine.shutdown()


def test_deepseek_v4_state_and_weights_are_what_the_engine_holds():
    engine = LLMEngine(EngineConfig(model="deepseek-v4-tiny-random", kv_cache_memory_bytes=8 << 20))
    try:
        plan, state = engine.memory_plan, engine.runner.state
        assert (engine.num_blocks, engine.num_window_blocks) == (
            plan.num_blocks,
            plan.num_window_blocks,
        )
        stacked = [
            state.window,
            state.csa_projections,
            state.hca_projections,
            state.csa_entries,
            state.csa_index_entries,
            state.hca_entries,
        ]
        allocated = sum(t.numel() * t.element_size() for t in stacked)
        assert allocated == pytest.approx(
            plan.kv_bytes_per_token_per_rank * plan.kv_tokens_per_rank
        )
        assert sum(kind.bytes_per_token for kind in plan.kv.kinds) * 16 == sum(
            plan.kv.group_block_bytes.values()
        )
        assert held_bytes(engine.runner.model) == plan.weights.total
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("model", "weights"),
    [
        ("smollm2-tiny-random", "int8"),
        ("smollm2-tiny-random", "int4"),
        ("gemma3-tiny-random", "int4"),
    ],
)
def test_quantized_weights_are_what_the_engine_holds(model, weights):
    from inference.engine.models import load_model

    loaded = load_model(model, torch.device("cpu"), weights=weights)
    plan = plan_memory(EngineConfig(model=model, weights=weights), 64 << 30, kv_budget="configured")
    assert held_bytes(loaded.model) == plan.weights.total


def test_the_plans_weights_are_what_a_loaded_packed_v4_holds(mid_v4_checkpoint):
    """The plan (config and headers only, meta device) against the bytes a loaded mid-size
    FP8/FP4 checkpoint really holds: within 5% in all, and its experts' share closely."""
    import torch

    from inference.engine.memory_plan import weight_bytes
    from inference.engine.memory_plan.model_spec import model_spec
    from inference.engine.memory_plan.weights import Sharding
    from inference.engine.models import load_model
    from inference.engine.models.deepseek_v4.held_bytes import held_bytes

    plan = weight_bytes(model_spec(str(mid_v4_checkpoint)), torch.float32, Sharding(), "fp32")
    held = held_bytes(load_model(str(mid_v4_checkpoint), torch.device("cpu")).model)
    assert abs(plan.total - held.total) <= 0.05 * held.total, (plan, held)
    assert abs(plan.experts - held.experts) <= 0.01 * held.experts, (plan, held)
