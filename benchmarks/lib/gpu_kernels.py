"""The GPU benchmark, part 1: the kernels at real sizes on CUDA — checked against their torch
references, then timed (triton's do_bench, median) against the bytes they must move and a
measured device-to-device copy. The quantized matmuls count the packed weight bytes they read
(weights and scales of the experts a batch touches): what bounds a V4 Flash decode step. V4's
sparse attention counts the pool rows its queries read (each query's own, once)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from triton.testing import do_bench

from inference.engine.kernels.copy_slots import copy_slots, copy_slots_reference, cow_slots
from inference.engine.kernels.decode_attention import decode_attention, decode_attention_reference
from inference.engine.kernels.prefill_attention import (
    prefill_attention,
    prefill_attention_reference,
)
from inference.engine.kernels.quantized_dispatch import (
    fp4_grouped_matmul_reference,
    fp8_block_linear_reference,
)
from inference.engine.kernels.quantized_matmul import fp4_grouped_matmul, fp8_block_linear
from inference.engine.kernels.store_kv import store_kv, store_kv_reference
from inference.engine.kernels.v4_sparse_attention import (
    sparse_attention,
    sparse_attention_reference,
)
from inference.engine.models.packed.formats import quantize_fp8

BLOCK_SIZE = 16
TOLERANCE = dict(atol=3e-2, rtol=2e-2)  # bf16 against the fp32 reference


@dataclass(frozen=True, slots=True)
class KernelTiming:
    name: str
    shape: str
    ms: float
    bytes_moved: int
    flops: float | None
    max_error: float | None  # against the reference; None when not checked
    ok: bool

    def gb_per_s(self) -> float:
        return self.bytes_moved / self.ms / 1e6


def copy_bandwidth_gb_per_s(device: torch.device, quick: bool) -> float:
    """A plain device-to-device copy: the bandwidth the kernels are measured against."""
    n = (256 if quick else 1024) << 20  # bytes per tensor
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * n / ms / 1e6  # read + write


def _paged_cache(seq_lens, num_kv_heads, head_dim, device, gen):
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(blocks) + 8, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    for b, n in enumerate(blocks):
        tables[b, :n] = torch.tensor(order[sum(blocks[:b]) : sum(blocks[:b]) + n])
    shape = ((sum(blocks) + 8) * BLOCK_SIZE, num_kv_heads, head_dim)
    return _randn(shape, device), _randn(shape, device), tables.to(device)


def _randn(shape, device) -> torch.Tensor:
    """bf16 N(0, 1) drawn on the GPU (hundreds of MB: too slow to draw on the CPU)."""
    return torch.empty(shape, dtype=torch.bfloat16, device=device).normal_()


def _checked(name, shape, run, reference, ms_of, bytes_moved, flops=None) -> KernelTiming:
    got = run()
    want = reference()
    error = (got.float() - want.float()).abs().max().item()
    ok = bool(torch.isfinite(got).all()) and torch.allclose(got.float(), want.float(), **TOLERANCE)
    return KernelTiming(name, shape, ms_of(run), bytes_moved, flops, error, ok)


def decode_case(
    name, num_seqs, context, heads, kv_heads, head_dim, window, device, gen, partition=512
):
    seq_lens = [context - random.Random(s).randrange(0, 64) for s in range(num_seqs)]
    k, v, tables = _paged_cache(seq_lens, kv_heads, head_dim, device, gen)
    q = _randn((num_seqs, heads, head_dim), device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    rows = torch.arange(num_seqs, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    args = (q, k, v, tables, lens, rows, BLOCK_SIZE, scale)
    keys = sum(min(n, window or n) for n in seq_lens)
    elem = 2
    moved = 2 * keys * kv_heads * head_dim * elem + 2 * q.numel() * elem
    return _checked(
        name, f"{num_seqs}×{context} ctx, H{heads}/KV{kv_heads}/D{head_dim}, w={window}",
        lambda: decode_attention(
            *args, max_seq_len=max(seq_lens), window=window, partition_size=partition
        ),
        lambda: decode_attention_reference(*args, window=window),
        _median_ms, moved, 4.0 * keys * heads * head_dim,
    )  # fmt: skip


def prefill_case(name, num_seqs, cached, new, heads, kv_heads, head_dim, window, device, gen):
    seq_lens = [cached + new] * num_seqs
    k, v, tables = _paged_cache(seq_lens, kv_heads, head_dim, device, gen)
    q = _randn((num_seqs * new, heads, head_dim), device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    starts = torch.arange(0, num_seqs * new, new, dtype=torch.int32, device=device)
    qlens = torch.full((num_seqs,), new, dtype=torch.int32, device=device)
    args = (q, k, v, tables, lens, starts, qlens, BLOCK_SIZE, head_dim**-0.5)
    visible = sum(min(cached + i + 1, window or 10**9) for i in range(new)) * num_seqs
    moved = 2 * (cached + new) * num_seqs * kv_heads * head_dim * 2 + 2 * q.numel() * 2
    shape = f"{num_seqs}×({cached} cached + {new} new), H{heads}/KV{kv_heads}/D{head_dim}"
    return _checked(
        name, f"{shape}, w={window}",
        lambda: prefill_attention(*args, max_query_len=new, window=window),
        lambda: prefill_attention_reference(*args, window=window),
        _median_ms, moved, 4.0 * visible * heads * head_dim,
    )  # fmt: skip


def store_kv_case(num_tokens, kv_heads, head_dim, device, gen) -> KernelTiming:
    num_slots = 4 * num_tokens
    k, v = (
        _randn((num_tokens, kv_heads, head_dim), device),
        _randn((num_tokens, kv_heads, head_dim), device),
    )
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens].to(device)
    caches = [torch.zeros(num_slots, kv_heads, head_dim, dtype=torch.bfloat16, device=device)]
    caches.append(torch.zeros_like(caches[0]))
    expected = [c.clone() for c in caches]
    store_kv(k, v, *caches, slots)
    store_kv_reference(k, v, *expected, slots)
    ok = all(torch.equal(a, b) for a, b in zip(caches, expected, strict=True))
    ms = _median_ms(lambda: store_kv(k, v, *caches, slots))
    moved = 2 * 2 * k.numel() * 2  # K and V, read and written
    return KernelTiming("store_kv", f"{num_tokens} tokens × KV{kv_heads}/D{head_dim}", ms, moved,
                        None, 0.0 if ok else None, ok)  # fmt: skip


def copy_slots_cases(num_layers, kv_heads, head_dim, device, gen) -> list[KernelTiming]:
    """Copy-on-write of 8 blocks (kernel vs torch ops): which one the engine should use."""
    cache = _randn((2 * num_layers, 1024 * BLOCK_SIZE, kv_heads, head_dim), device)
    blocks = torch.randperm(1024, generator=gen)[:16].tolist()
    src, dst = cow_slots([(blocks[i], blocks[i + 8], BLOCK_SIZE) for i in range(8)], BLOCK_SIZE,
                         device)  # fmt: skip
    expected = cache.clone()
    copy_slots_reference(expected, src, dst)
    copy_slots(cache, src, dst, use_kernel=True)
    ok = torch.equal(cache, expected)
    moved = 2 * cache.shape[0] * src.numel() * kv_heads * head_dim * 2
    shape = f"8 blocks × {2 * num_layers} caches"
    return [
        KernelTiming("copy_slots kernel", shape,
                     _median_ms(lambda: copy_slots(cache, src, dst, use_kernel=True)), moved,
                     None, 0.0 if ok else None, ok),
        KernelTiming("copy_slots torch ops", shape,
                     _median_ms(lambda: copy_slots(cache, src, dst, use_kernel=False)), moved,
                     None, None, True),
    ]  # fmt: skip


def fp8_linear_case(num_rows, out_features, in_features, device) -> KernelTiming:
    """bf16 rows through an FP8 weight with 128 x 128 block scales (V4 Flash's attention and
    shared-expert projections)."""
    weight, scale = quantize_fp8(torch.randn(out_features, in_features, device=device))
    x = _randn((num_rows, in_features), device)
    moved = weight.numel() + 4 * scale.numel()
    return _checked(
        "fp8 block linear", f"{num_rows} rows × ({out_features}, {in_features}) fp8, bf16 x",
        lambda: fp8_block_linear(x, weight, scale),
        lambda: fp8_block_linear_reference(x, weight, scale),
        _median_ms, moved, 2.0 * num_rows * out_features * in_features,
    )  # fmt: skip


def fp4_experts_case(
    num_tokens, top_k, num_experts, out_features, in_features, device, gen
) -> KernelTiming:
    """V4 Flash's routed experts: each token's top_k rows sorted by expert, one launch over
    e2m1 weights with an e8m0 scale per 32 inputs. Random bytes are valid e2m1 pairs."""
    weight = torch.randint(0, 256, (num_experts, out_features, in_features // 2), device=device,
                           dtype=torch.uint8)  # fmt: skip
    scale = torch.randint(118, 126, (num_experts, out_features, in_features // 32),
                          device=device, dtype=torch.uint8)  # fmt: skip
    # Each token picks top_k distinct experts; counts per expert make the sorted rows' offsets.
    picks = torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=1).indices
    counts = torch.bincount(picks.flatten(), minlength=num_experts)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(device)
    x = _randn((num_tokens * top_k, in_features), device)
    touched = int((counts > 0).sum())
    moved = touched * out_features * (in_features // 2 + in_features // 32)
    shape = (f"{num_tokens} tok × top-{top_k} of {num_experts} ({touched} touched) × "
             f"({out_features}, {in_features}) fp4")  # fmt: skip
    return _checked(
        "fp4 grouped experts", shape,
        lambda: fp4_grouped_matmul(x, offsets, weight, scale),
        lambda: fp4_grouped_matmul_reference(x, offsets, weight, scale),
        _median_ms, moved, 2.0 * x.shape[0] * out_features * in_features,
    )  # fmt: skip


def quantized_cases(device, gen, quick: bool) -> list[KernelTiming]:
    """V4 Flash sizes (hidden 4096, wo_b 4096 x 8192, experts 2048 x 4096, top-6 of 256):
    decode at the talk's 4 in flight, and a prefill chunk."""
    num_experts = 64 if quick else 256
    prefill = 512 if quick else 2048
    return [
        fp8_linear_case(4, 4096, 8192, device),
        fp8_linear_case(prefill, 4096, 8192, device),
        fp4_experts_case(4, 6, num_experts, 2048, 4096, device, gen),
        fp4_experts_case(prefill, 6, num_experts, 2048, 4096, device, gen),
    ]


def v4_attention_case(name, num_queries, num_entries, gen, device, heads=64, head_dim=512):
    """V4 Flash's attention: 64 heads of 512 over one K=V row per key, each query reading the
    window's 128 slots and `num_entries` compressed entries (CSA's top-512 picks, or HCA's
    entries so far), a random ~1/8 of the entry ids -1 (queries that see fewer)."""
    window_pool = _randn((4096, head_dim), device)
    entry_pool = _randn((max(4 * num_entries, 4096), head_dim), device)
    window = torch.stack(
        [torch.randperm(window_pool.shape[0], generator=gen)[:128] for _ in range(num_queries)]
    )
    entries = torch.stack(
        [torch.randperm(entry_pool.shape[0], generator=gen)[:num_entries]
         for _ in range(num_queries)]
    )  # fmt: skip
    entries[torch.rand(entries.shape, generator=gen) < 0.125] = -1
    parts = [(window_pool, window.to(device)), (entry_pool, entries.to(device))]
    q = _randn((num_queries, heads, head_dim), device)
    sinks = _randn((heads,), device)
    scale = head_dim**-0.5
    keys = int((window >= 0).sum() + (entries >= 0).sum())
    moved = 2 * keys * head_dim + 8 * (window.numel() + entries.numel()) + 2 * 2 * q.numel()
    return _checked(
        name, f"{num_queries} queries × (128 window + {num_entries} entries), H{heads}/D{head_dim}",
        lambda: sparse_attention(q, parts, sinks, scale),
        lambda: sparse_attention_reference(q, parts, sinks, scale),
        _median_ms, moved, 4.0 * keys * heads * head_dim,
    )  # fmt: skip


def v4_attention_cases(device, gen, quick: bool) -> list[KernelTiming]:
    """Decode at the talk's 4 and at 16 in flight (CSA: 512 picks; HCA at 64k tokens: 512
    entries), and a prefill chunk."""
    cases = [
        v4_attention_case("v4 sparse attention", 4, 512, gen, device),
        v4_attention_case("v4 sparse attention", 16, 512, gen, device),
        v4_attention_case("v4 sparse attention", 256 if quick else 1024, 512, gen, device),
    ]
    if not quick:  # HCA at a 4k-token context: 32 entries beside the window
        cases.append(v4_attention_case("v4 sparse attention", 16, 32, gen, device))
    return cases


def _median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_kernel_benchmarks(device: torch.device, quick: bool) -> list[KernelTiming]:
    torch.manual_seed(0)  # the GPU's draws
    gen = torch.Generator().manual_seed(0)  # block orders, on the CPU
    context = 1024 if quick else 4096
    results = [
        # SmolLM2-135M: 9 heads over 3 kv heads of 64; the target size.
        decode_case("decode", 64, context, 9, 3, 64, None, device, gen),
        decode_case("decode", 16, context, 9, 3, 64, None, device, gen),
        # Gemma 3 270M's sliding layers: 4 heads over 1 kv head of 256, window 512.
        decode_case("decode (window)", 64, context, 4, 1, 256, 512, device, gen),
        prefill_case("prefill", 4, 1024 if quick else 2048, 512 if quick else 2048, 9, 3, 64,
                     None, device, gen),
        prefill_case("prefill (window)", 4, 1024, 1024, 4, 1, 256, 512, device, gen),
        store_kv_case(8192, 3, 64, device, gen),
    ]  # fmt: skip
    if not quick:  # the split-K partition size, for tuning the launcher's default (512)
        results += [
            decode_case(f"decode (partition {p})", 64, context, 9, 3, 64, None, device, gen, p)
            for p in (256, 1024)
        ]
    return (
        results
        + copy_slots_cases(30, 3, 64, device, gen)
        + quantized_cases(device, gen, quick)
        + v4_attention_cases(device, gen, quick)
    )
