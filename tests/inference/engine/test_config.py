"""EngineConfig: four validated sub-configs, every field also taken and read by its flat name."""

from __future__ import annotations

import dataclasses

import pytest

from inference.engine.config import (
    CacheConfig,
    EngineConfig,
    RunnerConfig,
    SchedulerConfig,
    StructuredOutputConfig,
)
from inference.engine.structured_output.schema_limits import SchemaLimits


def test_flat_keywords_land_in_their_sub_configs_and_read_back_flat():
    config = EngineConfig(
        model="smollm2-tiny-random",
        enable_prefix_caching=False,
        retention_interval=32,
        max_num_seqs=3,
        enable_decode_windows=False,
        grammar_compile_workers=2,
    )
    assert config.cache.enable_prefix_caching is False and config.cache.retention_interval == 32
    assert config.scheduler.max_num_seqs == 3
    assert config.runner.enable_decode_windows is False
    assert config.structured_output.grammar_compile_workers == 2
    assert (config.enable_prefix_caching, config.retention_interval) == (False, 32)
    assert (config.max_num_seqs, config.enable_decode_windows) == (3, False)
    assert config.grammar_compile_workers == 2
    assert config.block_size == 16 and config.max_num_batched_tokens == 1024  # defaults


def test_flat_and_nested_spellings_make_equal_configs():
    flat = EngineConfig(block_size=8, num_kv_blocks=4, max_num_batched_tokens=8)
    nested = EngineConfig(
        cache=CacheConfig(block_size=8, num_kv_blocks=4),
        scheduler={"max_num_batched_tokens": 8},
    )
    assert flat == nested


def test_a_flat_keyword_overrides_a_given_sub_config_without_changing_it():
    cache = CacheConfig(block_size=8)
    config = EngineConfig(cache=cache, enable_prefix_caching=False)
    assert config.cache.block_size == 8 and config.enable_prefix_caching is False
    assert cache.enable_prefix_caching is True


def test_flat_names_are_read_only():
    config = EngineConfig()
    with pytest.raises(AttributeError):
        config.enable_prefix_caching = False  # type: ignore[misc]


def test_every_sub_config_field_has_its_flat_name():
    names = EngineConfig.keyword_names()
    for cls in (CacheConfig, SchedulerConfig, RunnerConfig, StructuredOutputConfig):
        for field in dataclasses.fields(cls):
            assert field.name in names
            assert hasattr(EngineConfig(), field.name)
    assert {"model", "device", "seed", "cache", "scheduler", "runner"} <= names


def test_an_unknown_keyword_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"unexpected keywords \['gpus'\]"):
        EngineConfig(gpus=2)


def test_replace_with_a_flat_name_copies_the_sub_config():
    config = EngineConfig(max_num_seqs=3)
    other = dataclasses.replace(config, enable_jump_forward=False, seed=5)
    assert (other.enable_jump_forward, other.max_num_seqs, other.seed) == (False, 3, 5)
    assert config.enable_jump_forward is True and config.seed == 0


def test_auto_dtype_and_backend_resolve_by_device_without_changing_the_given_runner():
    runner = RunnerConfig()
    cpu = EngineConfig(runner=runner)
    cuda = EngineConfig(device="cuda", runner=runner)
    assert (cpu.dtype, cpu.attention_backend) == ("float32", "torch")
    assert (cuda.dtype, cuda.attention_backend) == ("bfloat16", "triton")
    assert (runner.dtype, runner.attention_backend) == ("auto", "auto")


def test_schema_limits_may_be_a_dict():
    config = EngineConfig(schema_limits={"max_depth": 8})
    assert config.schema_limits == SchemaLimits(max_depth=8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"block_size": 12}, "block_size must be a power of two"),
        ({"retention_interval": 24}, r"retention_interval \(24\) must be a multiple"),
        ({"max_pinned_fraction": 1.0}, "max_pinned_fraction must be in"),
        ({"num_kv_blocks": 1}, "num_kv_blocks must be"),
        ({"kv_cache_memory_bytes": 1000}, "kv_cache_memory_bytes must be at least 1 MiB"),
        ({"max_num_seqs": 0}, "max_num_seqs must be"),
        ({"max_num_batched_tokens": 8}, r"max_num_batched_tokens \(8\) must be at least"),
        ({"max_model_len": 1}, "max_model_len must be"),
        ({"num_threads": 0}, "num_threads must be"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"dtype": "bfloat16"}, "needs device='cuda'"),
        ({"attention_backend": "flash"}, "attention_backend must be one of"),
        ({"grammar_compile_timeout_s": 0}, "grammar_compile_timeout_s must be"),
        ({"grammar_compile_workers": -1}, "grammar_compile_workers must be"),
        ({"schema_limits": 3}, "schema_limits must be a SchemaLimits"),
        ({"device": "tpu"}, "device must be one of"),
        ({"model": ""}, "model must be one of"),
        ({"cache": 16}, "cache must be a CacheConfig or a dict"),
    ],
)
def test_bad_values_are_refused_naming_them(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


def test_kv_tier_knobs_default_off_and_are_validated():
    config = EngineConfig()
    assert config.kv_host_cache_bytes == 0 and config.kv_disk_cache_dir is None
    assert config.kv_disk_cache_ttl_s == 3 * 86400 and not config.cache.has_tiers
    import pathlib

    on = EngineConfig(kv_disk_cache_dir=pathlib.Path("/tmp/kv"), kv_host_cache_bytes=1 << 20)
    assert on.kv_disk_cache_dir == "/tmp/kv" and on.cache.has_tiers
    with pytest.raises(ValueError, match="kv_host_cache_bytes must be an int ≥ 0"):
        EngineConfig(kv_host_cache_bytes=-1)
    with pytest.raises(ValueError, match="kv_disk_cache_dir must be a directory path"):
        EngineConfig(kv_disk_cache_dir="  ")
    with pytest.raises(ValueError, match="kv_disk_cache_bytes must be at least 1 MiB"):
        EngineConfig(kv_disk_cache_dir="/tmp/kv", kv_disk_cache_bytes=1000)
    with pytest.raises(ValueError, match="kv_disk_cache_ttl_s must be a finite"):
        EngineConfig(kv_disk_cache_ttl_s=0)
    with pytest.raises(ValueError, match="need enable_prefix_caching=True"):
        EngineConfig(kv_disk_cache_dir="/tmp/kv", enable_prefix_caching=False)
