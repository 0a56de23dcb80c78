"""ModelRunner: turns a SchedulerOutput into one flattened batch, runs the model, samples.

It owns the model and the KV cache tensors; the scheduler owns which slots are whose.
"""

from __future__ import annotations

import torch

from inference.engine.attention import AttentionMetadata, plan_shared_prefix, plan_span
from inference.engine.models import LoadedModel
from inference.engine.request import Request
from inference.engine.sampler import sample
from inference.engine.scheduler import SchedulerOutput
from inference.engine.structured_output import StructuredOutputManager


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        structured: StructuredOutputManager,
    ) -> None:
        self.model = loaded.model
        self.device = device
        self.block_size = block_size
        self.structured = structured
        cfg = loaded.config
        num_slots = num_blocks * block_size
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, device=device), torch.zeros(shape, device=device))
            for _ in range(cfg.num_layers)
        ]

    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns the sampled token of every request whose prompt is done."""
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        spans = []
        sampling: list[Request] = []
        logits_rows: list[int] = []
        shared = self._plan_shared_prefix(output)
        for index, scheduled in enumerate(output.scheduled):
            request = scheduled.request
            start = request.num_computed_tokens
            end = start + scheduled.num_new_tokens
            tokens = request.all_token_ids
            query_start = len(input_ids)
            input_ids.extend(tokens[start:end])
            positions.extend(range(start, end))
            slot_mapping.extend(self._slots(scheduled.block_ids, start, end))
            skip = shared[1] if shared and index in shared[0].span_indices else 0
            spans.append(
                plan_span(
                    query_start,
                    end - start,
                    scheduled.block_ids,
                    start,
                    self.block_size,
                    self.device,
                    skip_blocks=skip,
                )
            )
            if end == request.num_tokens:
                sampling.append(request)
                logits_rows.append(len(input_ids) - 1)

        meta = AttentionMetadata(
            torch.tensor(slot_mapping, device=self.device), spans, shared[0] if shared else None
        )
        logits = self.model(
            torch.tensor(input_ids, device=self.device),
            torch.tensor(positions, device=self.device),
            self.kv_caches,
            meta,
            torch.tensor(logits_rows, dtype=torch.long, device=self.device),
        )
        if not sampling:
            return {}
        self.structured.apply(logits, [r.grammar for r in sampling])
        tokens = sample(
            logits, [r.sampling_params for r in sampling], [r.generator for r in sampling]
        )
        return {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}

    def _plan_shared_prefix(self, output: SchedulerOutput):
        """Leading cached blocks shared by the decoding requests of this step, if any."""
        decode_blocks, num_full = {}, {}
        for index, scheduled in enumerate(output.scheduled):
            if scheduled.num_new_tokens == 1:
                decode_blocks[index] = scheduled.block_ids
                # Blocks before the one that receives this step's token.
                num_full[index] = scheduled.request.num_computed_tokens // self.block_size
        return plan_shared_prefix(decode_blocks, num_full, self.block_size, self.device)

    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        size = self.block_size
        return [block_ids[p // size] * size + p % size for p in range(start, end)]
