"""The workload's compute floor on this machine: what any exact float32 engine must spend.

Measured in the same process as the runs, on the loaded model's own weights once its engine has
shut down (no second OpenMP team beside the one timing it), each piece at the shape its kernel
likes best, everything else counted as free:

- prefill: every prompt token that no earlier prompt starts with (token-exact reuse: the
  shared head once, on two ticks each resident's own head once) goes once through every weight
  matrix (timed as one 1,024-row matmul per matrix) and attends to the tokens before it
  (timed as the CPU flash kernel over 1,024 × 1,024 query-key pairs per layer, KV groups
  folded; a causal pair costs what a dense one does, as if the kernel skipped masked blocks
  perfectly);
- decode: every output token the model must sample (jump-forward's appended tokens excluded)
  is its share of a step with `concurrency` sequences that reads every weight once (a
  `concurrency`-row matmul per matrix, the output head included) and each sequence's keys
  once (the shared head once for all), in the KV cache's dtype, the keys read whole or in
  the equal slices the engine's decode windows use, whichever is faster, each layer its own
  (a step reads them from memory; one layer's keys timed 30 times would sit in the cache).

Norms, rotary embeddings, activations, sampling, the grammar, Python and scheduling cost
nothing here, so no engine reaches this; it bounds the ratio to the baseline any engine
could show on this machine, for this workload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from benchmarks.lib import baseline_llamacpp
from benchmarks.lib.report import RunSummary
from benchmarks.lib.results import RunResult
from inference.engine.attention.decode_windows import SPLITS

CHUNK = 1024
DECODE_TRIES = 9


@dataclass(frozen=True, slots=True)
class Floor:
    prefill_linear_s: float
    prefill_attention_s: float
    decode_s: float
    num_requests: int
    # The same prefill with no prefix cache: every prompt whole, its attention causal.
    uncached_prefill_s: float = 0.0
    # One decode step with `concurrency` sequences: every weight read once, and the keys.
    decode_weights_s: float = 0.0
    decode_keys_s: float = 0.0

    @property
    def decode_step_s(self) -> float:
        return self.decode_weights_s + self.decode_keys_s

    @property
    def prefill_s(self) -> float:
        return self.prefill_linear_s + self.prefill_attention_s

    @property
    def total_s(self) -> float:
        return self.prefill_linear_s + self.prefill_attention_s + self.decode_s

    @property
    def requests_per_min(self) -> float:
        return self.num_requests * 60 / self.total_s


@dataclass(frozen=True, slots=True)
class WorkloadCounts:
    num_new_tokens: int  # prompt tokens no earlier prompt started with (the head once)
    num_pairs: float  # query-key pairs their attention needs
    num_decode_steps: int  # batched steps for the tokens the model samples after the first
    keys_per_step: int  # keys one decode step reads (the shared head once)
    uncached_tokens: int  # without a prefix cache: every prompt token
    uncached_pairs: float


def workload_counts(
    prompt_token_counts: list[int],
    reused_tokens: list[int],
    shared_prefix_tokens: int,
    num_sampled_tokens: int,
    concurrency: int,
) -> WorkloadCounts:
    """What the workload asks of any engine, in tokens, pairs and steps. `reused_tokens`: of
    each prompt, the prefix an earlier prompt starts with (computed once, reused after)."""
    shared = shared_prefix_tokens
    mean_context = sum(prompt_token_counts) / len(prompt_token_counts)
    # The first token of each request comes out of its prefill.
    after_first = max(0, num_sampled_tokens - len(prompt_token_counts))
    prompts = list(zip(prompt_token_counts, reused_tokens, strict=True))
    return WorkloadCounts(
        num_new_tokens=sum(n - r for n, r in prompts),
        # Each new token over the reused prefix, and over the new ones before it (causal).
        num_pairs=sum((n - r) * r + (n - r) ** 2 / 2 for n, r in prompts),
        num_decode_steps=-(-after_first // concurrency),
        keys_per_step=int(shared + concurrency * (mean_context - shared)),
        uncached_tokens=sum(prompt_token_counts),
        uncached_pairs=sum(n * n / 2 for n in prompt_token_counts),
    )


def _best_of(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _layer_linears(model) -> list[torch.nn.Module]:
    """Each layer's projections as the model runs them: nn.Linear, or QuantizedLinear with
    weights="int8"/"int4" (then the floor is that format's: its kernel at decode sizes)."""
    linears = []
    for layer in model.layers:
        linears += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
        linears += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
    return linears


@torch.inference_mode()
def measure_floor(
    model,
    prompt_token_counts: list[int],
    reused_tokens: list[int],
    shared_prefix_tokens: int,
    cached_run: RunResult,
    concurrency: int,
    kv_dtype: torch.dtype = torch.float32,
) -> Floor | None:
    """The floor for `cached_run`'s requests; None for a model with sliding-window layers
    (their attention is bounded by the window, which this estimate does not model)."""
    cfg = model.config
    if "sliding" in cfg.paged_state_spec().kv_groups:
        return None
    linears = _layer_linears(model)
    num_layers, n_kv, head_dim = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    group = cfg.num_heads // n_kv
    sampled = sum(r.num_output_tokens for r in cached_run.records)
    sampled -= (cached_run.engine_stats or {}).get("num_forced_tokens", 0)
    counts = workload_counts(
        prompt_token_counts, reused_tokens, shared_prefix_tokens, sampled, concurrency
    )
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    # Prefill: one CHUNK-row matmul per weight matrix; CHUNK × CHUNK pairs per layer.
    xs = {m.in_features: torch.randn(CHUNK, m.in_features) for m in linears}
    per_token = _best_of(lambda: [m(xs[m.in_features]) for m in linears]) / CHUNK
    q = torch.randn(1, n_kv, group * CHUNK, head_dim)
    k = torch.randn(1, n_kv, CHUNK, head_dim)
    per_pair = _best_of(lambda: flash(q, k, k, 0.0, False, scale=0.125)) * num_layers
    per_pair /= CHUNK * CHUNK

    # Decode: every weight (the output head too) read once a step; the step's keys once.
    step_linears = [*linears, model.lm_head]
    rows = {m.in_features: torch.randn(concurrency, m.in_features) for m in step_linears}
    # A decode step's pieces take milliseconds: more tries for a steadier best.
    weights_s = _best_of(lambda: [m(rows[m.in_features]) for m in step_linears], DECODE_TRIES)
    keys = (n_kv, group * concurrency, counts.keys_per_step, head_dim, kv_dtype)
    keys_s = min(_keys_read_s(flash, num_layers, *keys, splits=s) for s in (1, SPLITS))
    return Floor(
        prefill_linear_s=counts.num_new_tokens * per_token,
        prefill_attention_s=counts.num_pairs * per_pair,
        decode_s=counts.num_decode_steps * (weights_s + keys_s),
        num_requests=len(cached_run.records),
        uncached_prefill_s=counts.uncached_tokens * per_token + counts.uncached_pairs * per_pair,
        decode_weights_s=weights_s,
        decode_keys_s=keys_s,
    )


def _keys_read_s(
    flash, num_layers: int, n_kv: int, rows: int, keys: int, head_dim: int, dtype, splits: int
) -> float:
    """Every layer's attention of `rows` queries per KV head over `keys` keys of its own, in
    the kernel's favourite layout (contiguous per head), read as `splits` equal slices (the
    batch entries of one call, as decode_windows reads a long window). Each layer reads its
    own K and V, as a step does: a step's keys are read from memory, not from a warm cache."""
    length = -(-keys // splits)
    q = torch.randn(1, n_kv, rows, head_dim, dtype=dtype).expand(splits, -1, -1, -1)
    shape = (splits, n_kv, length, head_dim)
    layers = [
        (torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype))
        for _ in range(num_layers)
    ]
    return _best_of(
        lambda: [flash(q, k, v, 0.0, False, scale=0.125) for k, v in layers], DECODE_TRIES
    )


def format_floor(floor: Floor | None, runs: dict[str, float]) -> list[str]:
    """Lines for the report; `runs` maps run names to their requests per minute."""
    if floor is None:
        return ["compute floor: not estimated for a model with sliding-window layers"]
    lines = [
        f"compute floor (no engine reaches it): {floor.total_s:.1f} s for {floor.num_requests} "
        f"requests = {floor.requests_per_min:.1f} requests/min (prefill matmuls "
        f"{floor.prefill_linear_s:.1f} s, prefill attention {floor.prefill_attention_s:.1f} s, "
        f"decode {floor.decode_s:.1f} s)"
    ]
    lines.append(
        f"prefill floor, caching on / off: {floor.prefill_s / floor.uncached_prefill_s:.2f} "
        f"(the reused head saves its tokens' matmuls; attention to it still costs)"
    )
    if "cached" in runs:
        share = runs["cached"] / floor.requests_per_min
        lines.append(f"engine (cached) at {share:.0%} of the floor")
    if runs.get("transformers"):
        ratio = floor.requests_per_min / runs["transformers"]
        lines.append(
            f"floor / transformers, requests/min: {ratio:.2f}× (the most any engine shows)"
        )
    return lines


def format_decode_floor(
    floor: Floor,
    summaries: dict[str, RunSummary],
    concurrency: int,
    weights: str,
    kv_cache_dtype: str,
) -> list[str]:
    """Lines for the report: the decode step's floor against the main (cached) run's decode,
    alone and in the workload, and against llama.cpp's when it ran."""
    per_token = summaries["cached"].decode_s_per_token
    lines = [
        f"decode step floor at {concurrency} in flight ({weights} weights read "
        f"once {floor.decode_weights_s * 1e3:.1f} ms, {kv_cache_dtype} keys once "
        f"{floor.decode_keys_s * 1e3:.1f} ms): {floor.decode_step_s * 1e3:.1f} ms; engine "
        f"decode per token {per_token * 1e3:.1f} ms = {per_token / floor.decode_step_s:.2f}× "
        "the floor"
    ]
    llamacpp = summaries.get(baseline_llamacpp.NAME)
    if llamacpp is not None and llamacpp.decode_s_per_token:
        lines.append(decode_target_line(floor, llamacpp.decode_s_per_token))
    alone = summaries["cached"].steady_decode_s_per_token
    if alone:
        lines.append(
            f"engine decode alone at {concurrency} in flight {alone * 1e3:.1f} ms = "
            f"{alone / floor.decode_step_s:.2f}× the floor"
        )
    return lines


def decode_target_line(floor: Floor, llamacpp_s_per_token: float) -> str:
    """What the per-request decode target (≥ 0.5× llama.cpp's single stream, a token per step
    for each sequence) allows a step, against the floor of torch's own kernels."""
    allowed = 2 * llamacpp_s_per_token
    left = allowed - floor.decode_step_s
    head = (
        f"decode target (each request ≥ 0.5× llama.cpp's {llamacpp_s_per_token * 1e3:.1f} ms a "
        f"token) allows a step of {allowed * 1e3:.1f} ms: "
    )
    if left >= 0:
        return head + f"the floor leaves {left * 1e3:.1f} ms ({left / allowed:.0%}) for the rest"
    return head + (
        f"the floor is {-left * 1e3:.1f} ms ({-left / allowed:.0%}) over it, so no engine on "
        "these kernels meets it on this machine"
    )


def floor_json(floor: Floor) -> dict:
    return {
        "total_s": floor.total_s,
        "requests_per_min": floor.requests_per_min,
        "prefill_linear_s": floor.prefill_linear_s,
        "prefill_attention_s": floor.prefill_attention_s,
        "decode_s": floor.decode_s,
        "uncached_prefill_s": floor.uncached_prefill_s,
        "decode_step_s": floor.decode_step_s,
        "decode_weights_s": floor.decode_weights_s,
        "decode_keys_s": floor.decode_keys_s,
        "prefill_cached_over_uncached": floor.prefill_s / floor.uncached_prefill_s,
    }
