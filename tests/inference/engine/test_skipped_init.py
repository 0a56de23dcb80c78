"""models.skipped_init: modules built inside draw no random numbers, and planning an engine's
memory (the model on the meta device) does not import torch._dynamo (2.6 s a process)."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from inference.engine.models.skipped_init import skipped_init
from tests.child_processes import REPO_ROOT


def test_modules_built_inside_draw_no_random_numbers():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with skipped_init():
        linear, embedding = nn.Linear(8, 4), nn.Embedding(5, 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert linear.weight.shape == (4, 8) and embedding.weight.shape == (5, 3)
    nn.Linear(8, 4)  # outside: torch's initialisation as ever
    assert not torch.equal(torch.get_rng_state(), state)


def test_the_memory_plans_models_on_meta_import_no_dynamo():
    script = (
        "import sys\n"
        "from inference.engine.memory_plan.model_spec import model_spec\n"
        "from inference.engine.memory_plan.weights import meta_model\n"
        "for name in ('smollm2-tiny-random', 'gemma3-tiny-random', 'deepseek-v4-tiny-random'):\n"
        "    meta_model(model_spec(name))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", result.stdout
