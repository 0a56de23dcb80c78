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
