"""Settings → EngineConfig, in the one place it happens; what a bad INFERENCE_ENGINE says."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference.completions.runtime import engine_config_from_settings
from inference.engine import EngineConfig


def test_engine_config_comes_from_settings(settings):
    settings.INFERENCE_ENGINE = {"model": "smollm2-tiny-random", "device": "cpu", "max_num_seqs": 4}
    config = engine_config_from_settings()
    assert isinstance(config, EngineConfig)
    assert (config.model, config.device, config.max_num_seqs) == ("smollm2-tiny-random", "cpu", 4)


def test_the_kv_disk_key_reaches_the_engine_and_no_error_shows_it(settings):
    settings.INFERENCE_ENGINE = {"model": "smollm2-tiny-random", "kv_disk_cache_dir": "/tmp/kv"}
    settings.INFERENCE_KV_DISK_KEY = "a deployment secret, 32 chars.."
    assert engine_config_from_settings().cache.disk_cache_key == b"a deployment secret, 32 chars.."
    settings.INFERENCE_KV_DISK_KEY = "tiny-key"
    with pytest.raises(ImproperlyConfigured, match="kv_disk_cache_key must be") as caught:
        engine_config_from_settings()
    assert "tiny-key" not in str(caught.value)


@pytest.mark.parametrize(
    ("engine_settings", "message"),
    [
        (["smollm2"], "INFERENCE_ENGINE must be a dict"),
        ({"model": "smollm2-tiny-random", "gpus": 2}, r"does not take: \['gpus'\]"),
        ({"device": "tpu"}, "INFERENCE_ENGINE is invalid: device must be one of"),
        ({"block_size": 12}, "block_size must be a power of two"),
    ],
)
def test_bad_engine_settings_say_what_to_fix(settings, engine_settings, message):
    settings.INFERENCE_ENGINE = engine_settings
    with pytest.raises(ImproperlyConfigured, match=message):
        engine_config_from_settings()


def test_an_engine_that_lost_a_rank_is_replaced_on_next_use(settings):
    """A tensor-parallel engine whose worker died fails its requests; the next engine_get
    shuts it down and builds a new one (here its worker is spawned again)."""
    import os
    import signal
    import time

    from inference.completions.runtime import engine_get, engine_shutdown
    from inference.engine import SamplingParams

    settings.INFERENCE_ENGINE = {
        "model": "smollm2-tiny-random",
        "num_kv_blocks": 32,
        "num_threads": 1,
        "tensor_parallel_size": 2,
        "distributed_timeout_s": 60.0,
    }
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine_shutdown()
    try:
        first = engine_get()
        expected = first.generate([[3, 1, 4]], params)[0].token_ids
        os.kill(first.executor.workers.pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while first.failure is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "rank 1 exited" in str(first.failure)
        second = engine_get()
        assert second is not first and second.failure is None
        assert second.generate([[3, 1, 4]], params)[0].token_ids == expected
    finally:
        engine_shutdown()


def test_a_configured_engine_starts_empty_even_with_a_disk_tier_in_the_settings(settings, tmp_path):
    from inference.completions.runtime import engine_configured, engine_settings

    settings.INFERENCE_ENGINE = {
        "model": "smollm2-tiny-random",
        "kv_disk_cache_dir": str(tmp_path),
        "kv_host_cache_bytes": 1 << 20,
    }
    with engine_configured(num_kv_blocks=64) as engine:
        assert engine.offloader is None  # the experiment's steps must not share blocks
        # In effect for this engine, beside it; Django's settings are left alone.
        assert engine_settings()["kv_disk_cache_dir"] is None
        assert engine_settings()["num_kv_blocks"] == 64
        assert settings.INFERENCE_ENGINE["kv_disk_cache_dir"] == str(tmp_path)
        assert "num_kv_blocks" not in settings.INFERENCE_ENGINE
    with engine_configured(num_kv_blocks=64, kv_disk_cache_dir=str(tmp_path)) as engine:
        assert engine.offloader is not None and engine.offloader.disk is not None
    assert settings.INFERENCE_ENGINE["kv_disk_cache_dir"] == str(tmp_path)


def test_an_engine_the_tiers_cannot_hold_says_how_to_turn_them_off(settings, tmp_path):
    """A tensor-parallel engine with a disk tier (the tiers do not read KV shards yet) is
    refused before any worker starts, saying how to turn the tier off."""
    from inference.completions.runtime import engine_get, engine_shutdown

    engine_shutdown()
    settings.INFERENCE_ENGINE = {
        "model": "smollm2-tiny-random",
        "tensor_parallel_size": 2,
        "kv_disk_cache_dir": str(tmp_path),
    }
    with pytest.raises(ImproperlyConfigured, match="POKOMACHI_KV_DISK_DIR=off"):
        engine_get()
