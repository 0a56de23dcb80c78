"""pokosite/env.py: the one environment parser of the settings and the launcher."""

from __future__ import annotations

import pytest

from pokosite.env import (
    EnvError,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_retention_interval,
    env_str,
    env_tensor_parallel,
)


def test_unset_or_blank_is_the_default():
    for env in ({}, {"X": ""}):
        assert env_str("X", "d", env=env) == "d"
        assert env_bool("X", True, env=env) is True
        assert env_int("X", 7, env=env) == 7
        assert env_float("X", 1.5, env=env) == 1.5
        assert env_list("X", ["a"], env=env) == ["a"]
        assert env_retention_interval("X", env=env) is None
    assert env_int("X", 7, low=1, high=9, env={"X": "  "}) == 7


def test_values_are_parsed():
    assert env_str("X", env={"X": " redis://h/0 "}) == "redis://h/0"
    assert env_bool("X", False, env={"X": "On"}) is True
    assert env_bool("X", True, env={"X": "no"}) is False
    assert env_int("X", 0, low=1, high=65535, env={"X": "9001"}) == 9001
    assert env_float("X", 0.0, env={"X": "2.5"}) == 2.5
    assert env_list("X", [], env={"X": " a, b ,"}) == ["a", "b"]
    assert env_retention_interval("X", env={"X": "Dense"}) is None
    assert env_retention_interval("X", env={"X": "2048"}) == 2048


def test_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("POKOMACHI_ENV_TEST", "3")
    assert env_int("POKOMACHI_ENV_TEST", 0) == 3


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda: env_bool("X", True, env={"X": "maybe"}), "X='maybe': use one of 1/0"),
        (lambda: env_int("X", 0, env={"X": "soon"}), "X='soon': must be a whole number$"),
        (
            lambda: env_int("X", 0, low=1, high=64, env={"X": "0"}),
            "X='0': must be a whole number from 1 to 64",
        ),
        (lambda: env_float("X", 0.0, env={"X": "often"}), "X='often': must be a number"),
        (lambda: env_retention_interval("X", env={"X": "2k"}), "X='2k': must be a whole"),
    ],
)
def test_a_bad_value_names_the_variable_and_what_it_takes(read, message):
    with pytest.raises(EnvError, match=message):
        read()
    assert issubclass(EnvError, ValueError)


def test_tensor_parallel_settings_become_engine_config_keywords():
    from inference.engine.config import EngineConfig

    assert env_tensor_parallel(env={}) == {} == env_tensor_parallel(env={"POKOMACHI_TP_SIZE": "1"})
    remote = env_tensor_parallel(
        env={
            "POKOMACHI_TP_SIZE": "2",
            "POKOMACHI_TP_LAUNCH": "external",
            "POKOMACHI_TP_MASTER_ADDR": "10.0.0.1",
            "POKOMACHI_TP_MASTER_PORT": "29500",
        }
    )
    parallel = EngineConfig(**remote).parallel
    assert (parallel.tensor_parallel_size, parallel.worker_launch) == (2, "external")
    assert (parallel.master_addr, parallel.master_port) == ("10.0.0.1", 29500)
    assert EngineConfig(**env_tensor_parallel(env={"POKOMACHI_TP_SIZE": "2"})).parallel == (
        EngineConfig(tensor_parallel_size=2).parallel
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POKOMACHI_TP_SIZE": "two"}, "POKOMACHI_TP_SIZE='two'"),
        ({"POKOMACHI_TP_SIZE": "2", "POKOMACHI_TP_LAUNCH": "ray"}, "use spawn or external"),
        ({"POKOMACHI_TP_SIZE": "2", "POKOMACHI_TP_LAUNCH": "external"}, "needs POKOMACHI_TP_MAS"),
    ],
)
def test_bad_tensor_parallel_settings_name_the_variable(env, message):
    with pytest.raises(EnvError, match=message):
        env_tensor_parallel(env=env)
