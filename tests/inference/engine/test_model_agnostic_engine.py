"""The engine loop, the scheduler, the engine's assembly and the runner name no model: what a
model's paged state is comes from its config's `paged_state_spec()` (attention/paged_state.py),
never from a branch on which model runs (issue 35). The import-linter contract "The engine loop
and the runner name no model" (pyproject.toml) checks their imports; this walk checks their
code: no identifier or comment naming a model or its own state hooks, no `hasattr` at all, no
`getattr` with a default on a model or its config (a capability probe is a branch on the
model). Messages to the user may still say which models support a feature (string literals are
not walked)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import inference.engine
from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.attention.paged_kv import PagedKVSpec
from inference.engine.attention.torch_metadata import TorchMetadataBuilder
from inference.engine.memory_plan import model_spec
from inference.engine.models import ARCHITECTURES
from inference.engine.models.llama import LlamaConfig

ENGINE = Path(inference.engine.__file__).parent
FILES = [
    ENGINE / "core" / "llm_engine.py",
    ENGINE / "core" / "engine_builder.py",
    ENGINE / "core" / "scheduler.py",
    *sorted((ENGINE / "runner").rglob("*.py")),
]
MODEL_NAMES = re.compile(r"deepseek|llama|gemma|allocate_state", re.IGNORECASE)
PROBED = re.compile(r"model|config|loaded", re.IGNORECASE)


def model_branches(source: str) -> list[str]:
    """Where `source` names a model in its code or comments, or probes a model for a hook."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.COMMENT) and MODEL_NAMES.search(token.string):
            found.append(f"line {token.start[0]}: {token.string}")
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        probe = node.func.id == "hasattr" or (
            node.func.id == "getattr"
            and len(node.args) == 3
            and PROBED.search(ast.unparse(node.args[0]))
        )
        if probe:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_the_engine_loop_and_the_runner_name_no_model(path):
    assert model_branches(path.read_text()) == []


@pytest.mark.parametrize(
    "planted",
    [
        'own_state = hasattr(self.model, "allocate_state")',
        'has_mtp = getattr(model, "has_mtp", False)',
        "from inference.engine.models.deepseek_v4.loader import Shard",
        "if isinstance(model, LlamaForCausalLM):\n    pass",
        "x = 1  # DeepSeek-V4 keeps its own state",
    ],
)
def test_the_walk_sees_a_model_branch(planted):
    assert model_branches(planted)
    assert not model_branches('dtype = getattr(torch, "float32")\nraise ValueError("DeepSeek")')


# One model of every architecture (ARCHITECTURES), by a name memory_plan knows without weights.
MODELS = {
    "llama": "smollm2-tiny-random",
    "gemma3": "gemma3-tiny-random",
    "deepseek_v4": "deepseek-v4-flash",
}


@pytest.mark.parametrize("block_size", [16, 32])
def test_every_architecture_says_what_its_paged_state_is(block_size):
    assert set(MODELS) == set(ARCHITECTURES)
    for arch, name in MODELS.items():
        spec = model_spec(name).config.paged_state_spec()
        group_bytes = spec.group_block_bytes(block_size)
        assert tuple(group_bytes) == spec.kv_groups, arch
        for group, size in group_bytes.items():  # fp32: 4 bytes an element
            kinds = [k for k in spec.state_kinds(block_size, 4) if k.group == group]
            assert sum(k.bytes_per_token for k in kinds) * block_size == size, (arch, group)


class _SpecWithoutKernels(PagedKVSpec):
    """Plain paged K/V as a state the triton backend has no kernels for."""

    has_attention_kernels = False


def test_a_state_without_kernels_runs_the_torch_path_when_triton_is_asked(monkeypatch, caplog):
    """attention_backend="triton" ("auto" on CUDA) on a state with no kernels: the runner says
    so and plans the torch path, whatever the model (no device check: this process has no
    interpreter, so the kernel path would be refused)."""
    monkeypatch.setattr(
        LlamaConfig,
        "paged_state_spec",
        lambda config: _SpecWithoutKernels(
            config.layer_types, config.num_kv_heads, config.head_dim, config.sliding_window
        ),
    )
    engine = LLMEngine(
        EngineConfig(model="smollm2-tiny-random", num_kv_blocks=16, attention_backend="triton")
    )
    try:
        assert isinstance(engine.runner.metadata_builder, TorchMetadataBuilder)
        assert "has no kernel for LlamaForCausalLM's attention yet" in caplog.text
        (out,) = engine.generate(
            [[5, 6, 7, 8]], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        )
    finally:
        engine.shutdown()
    assert len(out.token_ids) == 2
