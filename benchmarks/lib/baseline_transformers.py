"""The baseline a user would otherwise pick: transformers' GGUF loader (fp32) and greedy
`generate`, one request at a time.

transformers is a test-only dependency: it is imported here, lazily, and nowhere else in the
engine. It has no JSON-schema constraint built in, so the baseline runs unconstrained.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from benchmarks.lib.results import RequestRecord, RunResult
from benchmarks.lib.workload import Workload
from inference.engine.loading.model_files import TINY_RANDOM_MODELS, gguf_path_for
from inference.engine.models.deepseek_v4 import tiny as deepseek_v4_tiny


class _TokenClock:
    """A `generate` streamer that only notes when each batch of tokens arrives."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:  # first call: the prompt; then one call per new token
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _load_reference(transformers, model: str):
    """transformers' tokenizer and fp32 model for `model`: from the GGUF file, or for
    DeepSeek-V4's tiny checkpoint from its directory (random weights, but the same ones the
    engine serves, so both run the same model)."""
    import torch

    if model == deepseek_v4_tiny.NAME:
        import json

        from safetensors.torch import load_file

        path = deepseek_v4_tiny.tiny_checkpoint(0)
        config = transformers.DeepseekV4Config(**json.loads((path / "config.json").read_text()))
        config._attn_implementation = "eager"
        hf_model = transformers.DeepseekV4ForCausalLM(config)
        weights = load_file(str(path / "model.safetensors"))
        # transformers does not build the MTP layer (`mtp.0.*`, ours: deepseek_v4.mtp).
        main = {name: tensor for name, tensor in weights.items() if not name.startswith("mtp.")}
        hf_model.load_state_dict(main, strict=True)
        return transformers.AutoTokenizer.from_pretrained(str(path)), hf_model.eval()
    path = gguf_path_for(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return tokenizer, hf_model


def run_transformers(
    workload: Workload, *, model: str, num_requests: int, output_token_counts: list[int]
) -> RunResult:
    """Greedy-generate the first `num_requests` requests, request i making exactly
    `output_token_counts[i]` tokens (what the engine made for it, so both do the same work)."""
    if model in TINY_RANDOM_MODELS:
        raise ValueError(
            f"the transformers baseline needs real weights, and {model!r} is a random-weight "
            "test model: pass --skip-baseline, or use --model smollm2-135m-instruct"
        )
    if not 1 <= num_requests <= len(workload.requests):
        raise ValueError(
            f"baseline requests must be in [1, {len(workload.requests)}], got {num_requests}"
        )
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ValueError(
            "the transformers baseline needs the test extras: pip install -e '.[test]' "
            "(or pass --skip-baseline)"
        ) from exc
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer, hf_model = _load_reference(transformers, model)

    def generate(messages: list[dict[str, str]], num_tokens: int) -> RequestRecord:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)  # 5.x: BatchEncoding
        input_ids = torch.tensor([ids])
        clock = _TokenClock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=num_tokens,
                min_new_tokens=num_tokens,
                do_sample=False,
                streamer=clock,
                pad_token_id=tokenizer.eos_token_id,
            )
        new_ids = out[0, input_ids.shape[1] :].tolist()
        first, last = clock.times[1], clock.times[-1]
        return RequestRecord(
            num_prompt_tokens=len(ids),
            num_cached_tokens=0,
            num_output_tokens=len(new_ids),
            queue_s=0.0,
            prefill_s=first - start,
            decode_s=last - first,
            e2e_s=last - start,
            text=tokenizer.decode(new_ids, skip_special_tokens=True),
            finish_reason="length",
        )

    generate([{"role": "user", "content": "Hi"}], 2)  # warm-up, like the engine runs
    start = time.perf_counter()
    records = [
        generate(messages, output_token_counts[i])
        for i, messages in enumerate(workload.requests[:num_requests])
    ]
    return RunResult(
        name="transformers",
        description="transformers generate (fp32), greedy, one request at a time",
        records=records,
        wall_s=time.perf_counter() - start,
        schema=None,
        notes=[
            "transformers has no JSON-schema constraint built in: the baseline runs "
            "unconstrained, each request forced to the engine's output length for it",
        ],
    )
