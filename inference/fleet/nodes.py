"""The inference nodes of this deployment and their Celery queues.

Nodes are named in settings.INFERENCE_NODES (env POKOMACHI_NODES, comma-separated; default
"local"). Each node has one Celery queue, named after the node, consumed by that node's worker:
`celery -A pokosite worker -Q <node> --pool threads --concurrency 16 -n <node>@%h` (16 threads
by default: pokosite/launcher.py, WORKER_THREADS).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from inference.errors import UnknownNodeError

# A node name is a queue name and a worker hostname prefix (`<node>@host`), so it stays plain.
NODE_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def node_name_problem(name: object) -> str | None:
    """Why `name` cannot name a node, or None when it can."""
    if not isinstance(name, str) or not NODE_NAME_PATTERN.fullmatch(name):
        return (
            f"invalid node name {name!r}: use lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 63 characters (e.g. 'local', 'spark-a')"
        )
    return None


def node_names_problems(names: object) -> list[str]:
    """Everything wrong with a configured node list; empty when it is usable."""
    if not isinstance(names, (list, tuple)) or not names:
        return [
            "INFERENCE_NODES must be a non-empty list of node names "
            "(env POKOMACHI_NODES, comma-separated, e.g. 'spark-a,spark-b')"
        ]
    problems = [p for p in map(node_name_problem, names) if p]
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        problems.append(f"INFERENCE_NODES names {duplicates} more than once; name each node once")
    return problems


def node_names() -> list[str]:
    """The configured node names, in order; the first is the default node."""
    names = settings.INFERENCE_NODES
    problems = node_names_problems(names)
    if problems:
        raise ImproperlyConfigured("; ".join(problems))
    return list(names)


def node_default() -> str:
    return node_names()[0]


def node_require(name: str) -> str:
    """`name` if it is a configured node, else UnknownNodeError saying which ones exist."""
    names = node_names()
    if name not in names:
        raise UnknownNodeError(
            f"unknown inference node {name!r}: the configured nodes are {names}. "
            "Pick one of them, or add it to POKOMACHI_NODES (comma-separated) and start "
            f"its worker: celery -A pokosite worker -Q {name} --pool threads -n {name}@%h"
        )
    return name


def node_queue(name: str) -> str:
    """The Celery queue a node's worker consumes: the node's own name."""
    return node_require(name)


def nodes_without_worker(nodes: list[str], timeout_s: float = 3.0) -> list[str]:
    """The nodes whose queue no running Celery worker consumes (asks the workers over the
    broker; a node whose worker does not answer within `timeout_s` counts as without one)."""
    from pokosite.celery import app

    active = app.control.inspect(timeout=timeout_s).active_queues() or {}
    consumed = {queue["name"] for queues in active.values() for queue in queues}
    return [node for node in nodes if node not in consumed]
