"""The node registry: configured names, their queues, and the errors for unknown or bad names."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from inference.errors import UnknownNodeError
from inference.fleet.nodes import node_default, node_names, node_queue, node_require


def test_configured_nodes_and_their_queues(settings):
    settings.INFERENCE_NODES = ["spark-a", "spark-b"]
    assert node_names() == ["spark-a", "spark-b"]
    assert node_default() == "spark-a"
    assert node_require("spark-b") == "spark-b"
    assert node_queue("spark-b") == "spark-b"


def test_an_unknown_node_names_the_configured_ones(settings):
    settings.INFERENCE_NODES = ["local"]
    with pytest.raises(UnknownNodeError, match=r"'spark-c'.*\['local'\].*POKOMACHI_NODES"):
        node_require("spark-c")


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "must be a non-empty list"),
        (["Spark A"], "invalid node name 'Spark A'"),
        (["a@b"], "invalid node name 'a@b'"),
        (["local", "local"], r"names \['local'\] more than once"),
    ],
)
def test_bad_node_settings_fail_loudly_and_in_manage_py_check(settings, nodes, message):
    settings.INFERENCE_NODES = nodes
    with pytest.raises(ImproperlyConfigured, match=message):
        node_names()
    errors = [e for e in run_checks() if e.id == "inference.E001"]
    assert errors and any(message.replace("\\", "") in e.msg for e in errors)
