"""ModelRunner's KV cache: one stacked tensor whose rows hold the layers group by group, so that a
copy of slots reaches every layer of its group, and only those, in one call. The runner on the
torch path never imports triton."""

import subprocess
import sys

import torch

from inference.engine.kv.partial_blocks import BlockCopy


def test_a_block_copy_reaches_every_layer_of_its_group_and_no_other(make_hybrid_engine):
    runner = make_hybrid_engine(num_kv_blocks=16).runner
    size = runner.block_size
    kinds = runner.layer_types
    assert set(kinds) == {"full", "sliding"}
    saved = runner.state.cache.clone()
    try:
        with torch.inference_mode():
            for k, v in runner.kv_caches:
                k[: 4 * size].normal_()
                v[: 4 * size].normal_()
        for group, src, dst in (("sliding", 1, 2), ("full", 0, 3)):
            before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
            runner.copy_blocks([BlockCopy(group, src, dst, 5)])
            for kind, (k, v), (k0, v0) in zip(kinds, runner.kv_caches, before, strict=True):
                copied = k0.clone(), v0.clone()
                if kind == group:
                    for new, old in zip(copied, (k0, v0), strict=True):
                        new[dst * size : dst * size + 5] = old[src * size : src * size + 5]
                assert torch.equal(k, copied[0]) and torch.equal(v, copied[1]), (kind, group)
    finally:
        runner.state.cache.copy_(saved)


def test_the_runner_and_both_metadata_builders_import_without_triton():
    code = (
        "import sys, inference.engine.runner.model_runner, inference.engine.kernels.metadata; "
        "assert 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
