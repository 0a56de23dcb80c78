"""Settings → EngineConfig, in the one place it happens; what a bad INFERENCE_ENGINE says."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference.engine import EngineConfig
from inference.runtime import engine_config_from_settings


def test_engine_config_comes_from_settings(settings):
    settings.INFERENCE_ENGINE = {"model": "smollm2-tiny-random", "device": "cpu", "max_num_seqs": 4}
    config = engine_config_from_settings()
    assert isinstance(config, EngineConfig)
    assert (config.model, config.device, config.max_num_seqs) == ("smollm2-tiny-random", "cpu", 4)


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
