"""The kernels compile for an H100/H200 (sm_90) on this CPU-only machine: triton's compiler and
ptxas run without a GPU. The interpreter checks what the kernels compute; this checks what it
cannot: that the compiler accepts them (types merged across branches, dot shapes, casts) in the
configurations the launchers use for SmolLM2 and Gemma 3 in bf16/fp16 and for fp32, the
quantized matmuls (FP8 linear, FP4 experts) and V4's sparse attention, indexer and compressor
kernels at DeepSeek V4 Flash's shapes."""

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inference.engine.kernels.copy_slots import _copy_slots_kernel
from inference.engine.kernels.decode_attention import _decode_kernel, _merge_kernel
from inference.engine.kernels.prefill_attention import _prefill_kernel
from inference.engine.kernels.quantized_matmul import (
    _fp4_grouped_kernel,
    _fp8_block_linear_kernel,
)
from inference.engine.kernels.store_kv import _store_kv_kernel
from inference.engine.kernels.v4_compress import _compress_pool_kernel
from inference.engine.kernels.v4_indexer import _indexer_scores_kernel
from inference.engine.kernels.v4_sparse_attention import (
    _merge_splits_kernel,
    _sparse_attention_kernel,
)

pytestmark = pytest.mark.skipif(
    "nvidia" not in triton.backends.backends, reason="triton without its CUDA backend"
)

INDEX_POINTERS = ("block_tables_ptr", "seq_lens_ptr", "query_rows_ptr", "query_starts_ptr",
                  "query_lens_ptr", "slot_mapping_ptr", "src_ptr", "dst_ptr",
                  "first_blocks_ptr")  # fmt: skip
DATA_POINTERS = ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "k_ptr", "v_ptr", "cache_ptr")
# (n_heads, n_kv_heads, head_dim): SmolLM2-135M and Gemma 3 270M
MODELS = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256)}


def _compile(
    kernel, dtype: str, constexprs: dict, num_warps: int = 4, pointers: dict | None = None
) -> bytes:
    """pointers: the types of the arguments the lists below do not cover (or type otherwise)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif pointers and name in pointers:
            signature[name] = pointers[name]
        elif name in DATA_POINTERS:
            signature[name] = f"*{dtype}"
        elif name in INDEX_POINTERS:
            signature[name] = "*i32"
        elif name in ("part_out_ptr", "part_lse_ptr"):
            signature[name] = "*fp32"
        elif name == "scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 2}
    )
    # An H100/H200 SM has 227 KiB of shared memory for one block.
    assert compiled.metadata.shared <= 227 * 1024, (kernel.__name__, compiled.metadata.shared)
    return compiled.asm["cubin"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("model", MODELS)
def test_attention_kernels_compile_for_sm90(model, dtype):
    heads, kv_heads, head_dim = MODELS[model]
    group = heads // kv_heads
    common = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_D=head_dim, BLOCK_N=64,
                  UPCAST=False, PRECISION="tf32")  # fmt: skip
    # Window tables (first_blocks) on the sliding-window model, whole tables on the other.
    has_first = model == "gemma3"
    for split in (True, False):
        decode = dict(common, NUM_HEADS=heads, PARTITION=512, SPLIT=split, BLOCK_G=16,
                      HAS_FIRST=has_first)  # fmt: skip
        assert _compile(_decode_kernel, dtype, decode)
    merge = dict(NUM_HEADS=heads, HEAD_DIM=head_dim, PARTITION=512, BLOCK_P=8, BLOCK_D=head_dim)
    assert _compile(_merge_kernel, dtype, merge)
    prefill = dict(common, BLOCK_M=64, BLOCK_Q=64 // group, HAS_FIRST=has_first)
    assert _compile(_prefill_kernel, dtype, prefill)


def test_fp32_decode_and_the_copy_kernels_compile_for_sm90():
    decode = dict(NUM_HEADS=9, GROUP=3, HEAD_DIM=64, BLOCK_SIZE=16, PARTITION=512, SPLIT=True,
                  BLOCK_G=16, BLOCK_D=64, BLOCK_N=64, UPCAST=False, PRECISION="ieee",
                  HAS_FIRST=False)  # fmt: skip
    assert _compile(_decode_kernel, "fp32", decode)
    store = dict(NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK_H=4, BLOCK_D=64)
    assert _compile(_store_kv_kernel, "bf16", store)
    assert _compile(_copy_slots_kernel, "bf16", dict(ROW=192, BLOCK=256), num_warps=2)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_quantized_matmul_kernels_compile_for_sm90(dtype):
    precision = "ieee" if dtype == "fp32" else "tf32"
    for scale_type, e8m0 in (("*fp32", False), ("*u8", True)):
        fp8 = dict(SCALE_BLOCK=128, SCALE_E8M0=e8m0, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128,
                   UPCAST=False, PRECISION=precision)  # fmt: skip
        pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*u8", "scale_ptr": scale_type,
                    "out_ptr": "*fp32"}  # fmt: skip
        assert _compile(_fp8_block_linear_kernel, dtype, fp8, pointers=pointers)
    # V4 Flash's 256 routed experts: eight bisection steps find a tile's expert.
    fp4 = dict(NUM_EXPERTS=256, SEARCH_STEPS=8, GROUP=32, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128,
               UPCAST=False, PRECISION=precision)  # fmt: skip
    pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*u8", "scale_ptr": "*u8", "out_ptr": "*fp32",
                "offsets_ptr": "*i64", "tile_starts_ptr": "*i32"}  # fmt: skip
    assert _compile(_fp4_grouped_kernel, dtype, fp4, pointers=pointers)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_v4_sparse_attention_compiles_for_sm90(dtype):
    """V4 Flash: 64 heads of 512 over one K=V row, the window and the entries as two parts
    (int64 row ids, as the step tables build them), with and without split-K."""
    precision = "ieee" if dtype == "fp32" else "tf32"
    rows = {f"rows{i}_ptr": "*i64" for i in range(3)}
    pools = {f"pool{i}_ptr": f"*{dtype}" for i in range(3)}
    pointers = {"sinks_ptr": f"*{dtype}", **rows, **pools}
    for split in (True, False):
        attend = dict(NUM_PARTS=2, SPLIT=split, HEAD_DIM=512, BLOCK_H=16, BLOCK_D=512,
                      BLOCK_N=32, UPCAST=False, PRECISION=precision)  # fmt: skip
        assert _compile(_sparse_attention_kernel, dtype, attend, num_warps=8, pointers=pointers)
    merge = dict(HEAD_DIM=512, BLOCK_S=16, BLOCK_D=512)
    assert _compile(_merge_splits_kernel, dtype, merge)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_v4_indexer_and_compressor_kernels_compile_for_sm90(dtype):
    """At V4 Flash's sizes: the indexer's 64 heads of 128 over 64-entry tiles; the pooling of
    CSA (rate 4, overlapping: 8 positions) and HCA (rate 128, in tiles of 16) entries of 512
    channels, and CSA's indexer keys of 128, rope on the last 64."""
    indexer = dict(NUM_HEADS=64, HEAD_DIM=128, BLOCK_H=64, BLOCK_D=128, BLOCK_E=64,
                   UPCAST=False, PRECISION="ieee" if dtype == "fp32" else "tf32")  # fmt: skip
    pointers = {"q_ptr": f"*{dtype}", "weights_ptr": "*fp32", "keys_ptr": f"*{dtype}",
                "visible_ptr": "*i64", "out_ptr": "*fp32", "scale": "fp32"}  # fmt: skip
    assert _compile(_indexer_scores_kernel, dtype, indexer, pointers=pointers)
    pointers = {"proj_ptr": f"*{dtype}", "slots_ptr": "*i64", "prev_slots_ptr": "*i64",
                "bias_ptr": f"*{dtype}", "norm_ptr": f"*{dtype}", "cos_ptr": "*fp32",
                "sin_ptr": "*fp32", "out_ptr": "*fp32", "eps": "fp32"}  # fmt: skip
    for rate, head_dim, overlap, block_r in ((4, 512, True, 8), (4, 128, True, 8),
                                             (128, 512, False, 16)):  # fmt: skip
        width = 2 * head_dim if overlap else head_dim
        pool = dict(RATE=rate, HEAD_DIM=head_dim, WIDTH=width, ROPE_DIM=64, OVERLAP=overlap,
                    POSITIONS=2 * rate if overlap else rate, BLOCK_R=block_r,
                    BLOCK_D=head_dim)  # fmt: skip
        assert _compile(_compress_pool_kernel, dtype, pool, pointers=pointers)
