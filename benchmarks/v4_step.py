"""`python -m benchmarks v4-step`: does a DeepSeek-V4 decode step's time grow with the bytes it
reads, and no faster? (issue 35: step(n) / step(1) ≤ 1.25 × bytes(n) / bytes(1)).

A packed checkpoint (FP8 linears, FP4 experts: deepseek_v4.packed_checkpoint) of the mid-size
config (load_checkpoint.mid_config; `--layers` keeps its first N layers, `--size tiny` is the
tiny model's shape) is written, or reused with `--checkpoint DIR`, and served by the engine.
For each `--in-flight` n, n distinct random token-id prompts decode `--steps` tokens together
while hooks on the model watch every forward (StepRecorder):
- a decode step's time is the gap from its forward's start to the next forward's start (the
  whole engine step: schedule, model, sampling, update); the median over the run's steps;
- the bytes it reads are counted from what it did: every weight but the routed experts once
  (memory_plan.roofline.dense_read_bytes), plus, in each MoE layer, the distinct experts the
  step's tokens were routed to (the router's own choices, hash layers included) times that
  layer's bytes per expert (memory_plan.weights.tensor_bytes: FP4 codes and scales), plus each
  sequence's attention state at its context (roofline.state_read_bytes); the mean over the
  run's steps.
The prefill tokens/s is the one-in-flight run's prompt over its prefill time.

The steps run eagerly (no CUDA graphs): a replayed graph would skip the hooks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from benchmarks.lib.cli import add_arguments, cpu_model
from benchmarks.lib.output import emit, progress

BOUND = 1.25  # issue 35: step(n) / step(1) ≤ BOUND × bytes(n) / bytes(1)


# ---- the checkpoint -----------------------------------------------------------------------


def checkpoint_config(size: str, num_layers: int | None = None, tokenizer: bool = False) -> dict:
    """The config.json of the `size` ("mid" | "tiny") checkpoint, cut to its first num_layers;
    with `tokenizer`, its vocabulary the bundled tokenizer's."""
    from benchmarks.load_checkpoint import mid_config
    from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG, with_tokenizer

    config = mid_config() if size == "mid" else {**TINY_CONFIG, "vocab_size": 512}
    if tokenizer:
        config = with_tokenizer(config)
    total = config["num_hidden_layers"]
    if num_layers is None:
        return config
    if not 1 <= num_layers <= total:
        raise ValueError(f"--layers must be in [1, {total}] for {size}, got {num_layers}")
    cut = {key: config[key][:num_layers] for key in ("layer_types", "mlp_layer_types")}
    return {**config, **cut, "num_hidden_layers": num_layers}


def ensure_checkpoint(path: Path, config: dict, tokenizer: bool = False) -> bool:
    """Write the packed checkpoint of `config` into `path` unless one is there (with the
    bundled tokenizer beside it if asked); True if written. ValueError if the one there has
    another shape."""
    if (path / "config.json").is_file():
        held = json.loads((path / "config.json").read_text())
        keys = ("num_hidden_layers", "hidden_size", "n_routed_experts", "moe_intermediate_size")
        keys += ("vocab_size",)
        if any(held.get(key) != config[key] for key in keys):
            raise ValueError(
                f"{path} holds another checkpoint ({', '.join(f'{k} {held.get(k)}' for k in keys)})"
                "; give --size/--layers to match it, or another --checkpoint"
            )
        return False
    from inference.engine.models.deepseek_v4.packed_checkpoint import write_packed_checkpoint

    write_packed_checkpoint(path, config, seed=0)
    if tokenizer:
        from inference.engine.models.deepseek_v4.tiny import write_tokenizer

        write_tokenizer(path)
    return True


# ---- what each step did -------------------------------------------------------------------


@dataclass(slots=True)
class Forward:
    """One forward of the model: when it started, its tokens' positions, and each MoE layer's
    (tokens, top_k) expert ids, by the layer's experts module name."""

    started: float
    positions: torch.Tensor
    routes: dict[str, torch.Tensor] = field(default_factory=dict)


class StepRecorder:
    """Hooks on a DeepSeek-V4 model: a pre-hook on the model notes each forward's start and
    positions, a hook on every router (MTP's aside) keeps the expert ids it chose. Nothing is
    synchronized or counted inside the step: copies are kept and read afterwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        from inference.engine.models.deepseek_v4.moe import Router

        self.forwards: list[Forward] = []
        self._handles = [model.register_forward_pre_hook(self._on_forward)]
        for name, module in model.named_modules():
            if isinstance(module, Router) and not name.startswith("mtp."):
                experts = name.removesuffix(".gate") + ".experts"
                self._handles.append(module.register_forward_hook(partial(self._on_route, experts)))
        if len(self._handles) == 1:
            raise ValueError(f"{type(model).__name__} has no DeepSeek-V4 router to observe")

    def _on_forward(self, module, args) -> None:
        self.forwards.append(Forward(time.perf_counter(), args[1].clone()))

    def _on_route(self, experts: str, module, args, output) -> None:
        self.forwards[-1].routes[experts] = output[0].clone()  # a buffer may be reused

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass(frozen=True, slots=True)
class StepBytes:
    """How a step's bytes are counted: tensor_bytes' rows and the state's per-token size."""

    rows: list  # memory_plan.weights.tensor_bytes' (name, kind, bytes, meta tensor)
    expert_bytes: dict[str, float]  # one routed expert's bytes, by experts module name
    config: object  # the DeepseekV4Config
    itemsize: int  # the engine's float dtype: unpacked weights and the attention state

    @classmethod
    def of(cls, checkpoint: Path, dtype: torch.dtype) -> StepBytes:
        from inference.engine.memory_plan import model_spec
        from inference.engine.memory_plan.weights import Sharding, meta_model, tensor_bytes

        spec = model_spec(str(checkpoint))
        if spec.formats.experts != "fp4" or spec.formats.linears != "fp8":
            raise ValueError(f"{checkpoint} is not FP8/FP4-packed: {spec.formats}")
        rows = list(tensor_bytes(spec, meta_model(spec), dtype, Sharding(), "fp32"))
        per_expert: dict[str, float] = {}
        for name, kind, size, _ in rows:
            if kind == "experts" and not name.startswith("mtp."):
                module = name.rsplit(".", 1)[0]
                per_expert[module] = per_expert.get(module, 0) + size / spec.config.num_experts
        return cls(rows, per_expert, spec.config, dtype.itemsize)

    def of_step(self, forward: Forward) -> dict[str, float]:
        """The bytes `forward` read, by part, and the distinct experts a MoE layer it hit."""
        from inference.engine.memory_plan.roofline import dense_read_bytes, state_read_bytes

        distinct = {name: len(torch.unique(ids)) for name, ids in forward.routes.items()}
        contexts = (forward.positions + 1).tolist()
        return {
            "dense": dense_read_bytes(self.rows, len(contexts)),
            "experts": sum(n * self.expert_bytes[name] for name, n in distinct.items()),
            "state": sum(state_read_bytes(self.config, c, self.itemsize) for c in contexts),
            "distinct_experts_per_layer": sum(distinct.values()) / len(distinct),
        }


# ---- the measure --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InFlightRow:
    in_flight: int
    num_steps: int  # decode steps timed
    step_s: float  # median
    bytes: float  # mean a step: dense + experts + state
    dense_bytes: float
    expert_bytes: float
    state_bytes: float
    distinct_experts_per_layer: float  # mean over the MoE layers and the steps

    @property
    def tokens_per_s(self) -> float:
        return self.in_flight / self.step_s

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.step_s / 1e9


@dataclass(slots=True)
class V4StepResult:
    rows: list[InFlightRow]
    prefill_tokens_per_s: float | None  # the one-in-flight run's prompt
    prompt_tokens: int
    checkpoint: dict  # what it holds: layers, hidden, experts, packed bytes

    def ratios(self) -> list[dict]:
        """Each row against the first (one in flight): step ratio, bytes ratio, their quotient
        and whether it is within BOUND."""
        base = self.rows[0]
        out = []
        for row in self.rows:
            step, read = row.step_s / base.step_s, row.bytes / base.bytes
            quotient = step / read
            out.append(
                {"step_ratio": step, "bytes_ratio": read, "quotient": quotient,
                 "holds": quotient <= BOUND}
            )  # fmt: skip
        return out


def measure(
    engine,
    checkpoint: Path,
    in_flight: list[int],
    *,
    prompt_tokens: int,
    num_steps: int,
    seed: int = 0,
) -> V4StepResult:
    """Decode at each of `in_flight` on `engine` (serving `checkpoint`): the V4StepResult."""
    from inference.engine import SamplingParams

    model = engine.runner.model
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    counter = StepBytes.of(checkpoint, dtype)
    vocab = counter.config.vocab_size
    rng = random.Random(seed)

    def prompts(n: int) -> list[list[int]]:
        return [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(n)]

    params = SamplingParams(max_tokens=1 + num_steps, temperature=0.0, ignore_eos=True)
    engine.generate(prompts(1), SamplingParams(max_tokens=2, ignore_eos=True))  # warm up
    recorder = StepRecorder(model)
    rows, prefill_tps = [], None
    try:
        for n in in_flight:
            recorder.forwards.clear()
            outputs = engine.generate(prompts(n), params)
            if n == 1:
                prefill_tps = prompt_tokens / max(outputs[0].metrics.prefill_s, 1e-9)
            rows.append(_row(n, recorder.forwards, counter, prompt_tokens))
            progress(f"v4-step: {n} in flight, {rows[-1].step_s * 1e3:.1f} ms a step")
    finally:
        recorder.close()
    return V4StepResult(rows, prefill_tps, prompt_tokens, _describe(checkpoint, counter.config))


def _row(n: int, forwards: list[Forward], counter: StepBytes, prompt_tokens: int) -> InFlightRow:
    """The decode steps of one run: forwards of n tokens all past the prompts, each timed to
    the next forward's start (the last has none and is not timed)."""
    timed = [
        (after.started - forward.started, counter.of_step(forward))
        for forward, after in itertools.pairwise(forwards)
        if len(forward.positions) == n and int(forward.positions.min()) >= prompt_tokens
    ]
    if not timed:
        raise ValueError(
            f"no decode step of {n} sequences was observed (a CUDA graph replays without hooks; "
            "the engine must run eagerly)"
        )
    parts = [p for _, p in timed]

    def mean(key: str) -> float:
        return statistics.fmean(p[key] for p in parts)

    dense, experts, state = mean("dense"), mean("experts"), mean("state")
    return InFlightRow(
        in_flight=n,
        num_steps=len(timed),
        step_s=statistics.median(s for s, _ in timed),
        bytes=dense + experts + state,
        dense_bytes=dense,
        expert_bytes=experts,
        state_bytes=state,
        distinct_experts_per_layer=mean("distinct_experts_per_layer"),
    )


def _describe(checkpoint: Path, config) -> dict:
    return {
        "path": str(checkpoint),
        "packed_bytes": sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")),
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_intermediate_size": config.moe_intermediate_size,
    }


def engine_for(
    checkpoint: Path,
    device: str,
    max_in_flight: int,
    prompt_tokens: int,
    num_threads: int | None = None,
):
    from inference.engine import EngineConfig, LLMEngine

    return LLMEngine(
        EngineConfig(
            model=str(checkpoint),
            device=device,
            max_num_seqs=max_in_flight,
            max_num_batched_tokens=max(1024, prompt_tokens),
            enable_prefix_caching=False,  # every prompt is computed: no run reuses another's
            enable_cuda_graphs=False,  # the hooks must see every step (module docstring)
            num_threads=num_threads,
        )
    )


def run(args: argparse.Namespace) -> V4StepResult:
    """The checkpoint (written or reused), the engine on it, the measure."""
    in_flight = parse_in_flight(args.in_flight)
    with tempfile.TemporaryDirectory(prefix="v4-step-") as scratch:
        checkpoint = Path(args.checkpoint) if args.checkpoint else Path(scratch)
        started = time.perf_counter()
        config = checkpoint_config(args.size, args.layers, args.tokenizer)
        if ensure_checkpoint(checkpoint, config, args.tokenizer):
            progress(f"v4-step: wrote {checkpoint} in {time.perf_counter() - started:.0f} s")
        engine = engine_for(
            checkpoint, args.device, max(in_flight), args.prompt_tokens, args.threads
        )
        try:
            return measure(
                engine, checkpoint, in_flight,
                prompt_tokens=args.prompt_tokens, num_steps=args.steps, seed=args.seed,
            )  # fmt: skip
        finally:
            engine.shutdown()


def parse_in_flight(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        raise ValueError(f"--in-flight is comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1 or counts[0] != 1:
        raise ValueError(f"--in-flight starts at 1 (the ratios' base), all ≥ 1: got {text!r}")
    return counts


# ---- the report ---------------------------------------------------------------------------


def table(result: V4StepResult) -> str:
    lines = [
        "| in flight | step ms | tokens/s | experts/layer | bytes MB | GB/s "
        f"| step(n)/step(1) | bytes(n)/bytes(1) | quotient (≤ {BOUND}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row, r in zip(result.rows, result.ratios(), strict=True):
        lines.append(
            f"| {row.in_flight} | {row.step_s * 1e3:.1f} | {row.tokens_per_s:.1f} "
            f"| {row.distinct_experts_per_layer:.1f} | {row.bytes / 1e6:.1f} "
            f"| {row.gb_per_s:.2f} | {r['step_ratio']:.2f} | {r['bytes_ratio']:.2f} "
            f"| {r['quotient']:.2f} ({'holds' if r['holds'] else 'NOT held'}) |"
        )
    if result.prefill_tokens_per_s is not None:
        lines.append(
            f"\nprefill: {result.prefill_tokens_per_s:.0f} tokens/s "
            f"(one {result.prompt_tokens}-token prompt)"
        )
    return "\n".join(lines)


def as_json(result: V4StepResult) -> dict:
    return {
        "checkpoint": result.checkpoint,
        "prompt_tokens": result.prompt_tokens,
        "prefill_tokens_per_s": result.prefill_tokens_per_s,
        "bound": BOUND,
        "holds": all(r["holds"] for r in result.ratios()),
        "rows": [
            {**asdict(row), "tokens_per_s": row.tokens_per_s, "gb_per_s": row.gb_per_s, **r}
            for row, r in zip(result.rows, result.ratios(), strict=True)
        ],
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a packed V4 checkpoint directory: reused if it holds one, else written there "
        "(default: a temporary directory)",
    )
    parser.add_argument("--size", choices=("mid", "tiny"), default="mid", help="config to write")
    parser.add_argument(
        "--layers", type=int, default=None, help="keep the config's first N layers (default all)"
    )
    parser.add_argument(
        "--tokenizer",
        action="store_true",
        help="write the bundled tokenizer (SmolLM2's) into the checkpoint, its vocabulary "
        "sized to match, so that `benchmarks town --model DIR` can serve it",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--in-flight", default="1,4,8", help="comma-separated, starting at 1")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="each prompt's tokens")
    parser.add_argument(
        "--threads", type=int, default=None, help="the engine's torch threads (default torch's)"
    )
    parser.add_argument("--steps", type=int, default=8, help="decode steps at each in-flight")
    add_arguments(parser, "seed", "json", "json_out")


def main(args: argparse.Namespace) -> int:
    if args.steps < 2 or args.prompt_tokens < 1:
        raise ValueError("--steps must be ≥ 2 (a step is timed to the next), --prompt-tokens ≥ 1")
    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result = run(args)
    machine = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "cpu": cpu_model(),
        "torch_threads": args.threads or torch.get_num_threads(),
        "date": started,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # start, end
    }
    data = {"command": args.command, "machine": machine, **as_json(result)}
    c = result.checkpoint
    header = (
        f"{machine['date']} · {machine['device']} · {machine['cpu']} · load "
        f"{machine['load_avg_1m'][0]} → {machine['load_avg_1m'][1]}\n"
        f"packed V4 checkpoint: {c['num_layers']} layers, hidden {c['hidden_size']}, "
        f"{c['num_experts']} experts (top {c['num_experts_per_tok']}) of "
        f"{c['moe_intermediate_size']}, {c['packed_bytes'] / 1e6:.0f} MB; "
        f"{result.prompt_tokens}-token prompts\n\n"
    )
    verdict = "holds" if data["holds"] else "NOT held"
    verdict = f"\nstep(n)/step(1) ≤ {BOUND} × bytes(n)/bytes(1): {verdict}"
    return emit(args, data, header + table(result) + verdict)
