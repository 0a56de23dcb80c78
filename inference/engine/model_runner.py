"""ModelRunner: turns a SchedulerOutput into one flattened batch, runs the model, samples.

It owns the model and the KV cache tensors; the scheduler owns which slots are whose. A
hybrid model's layers come in two KV groups: full-attention layers index the full group's
slots, sliding-window layers their own (smaller in use, not in size) sliding group's, and get
their own metadata (`meta.sliding`) listing only the blocks of each request's window.

Before the forward it copies the partial blocks of token-exact reuse (copy-on-write): all
sources are read before any destination is written, in one gather and one scatter per layer.
"""

from __future__ import annotations

import torch

from inference.engine.attention import AttentionMetadata, plan_shared_prefix, plan_span
from inference.engine.models import LoadedModel
from inference.engine.partial_blocks import BlockCopy
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
        layer_types = layer_types_of(cfg)
        self.has_sliding = "sliding" in layer_types
        # One pair of tensors per layer; both groups have num_blocks blocks (see llm_engine).
        shape = (num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, device=device), torch.zeros(shape, device=device))
            for _ in layer_types
        ]
        self.layer_types = layer_types

    @torch.inference_mode()
    def copy_slots(self, copies: list[BlockCopy]) -> None:
        """Copy each record's first `num_slots` slots from its source block to its destination,
        in every layer of its group (full or sliding)."""
        size = self.block_size
        for group in ("full", "sliding"):
            mine = [c for c in copies if c.group == group]
            if not mine:
                continue
            src = [c.src_block_id * size + i for c in mine for i in range(c.num_slots)]
            dst = [c.dst_block_id * size + i for c in mine for i in range(c.num_slots)]
            src_index = torch.tensor(src, dtype=torch.long, device=self.device)
            dst_index = torch.tensor(dst, dtype=torch.long, device=self.device)
            for kind, (k_cache, v_cache) in zip(self.layer_types, self.kv_caches, strict=True):
                if kind == group:
                    k_cache.index_copy_(0, dst_index, k_cache.index_select(0, src_index))
                    v_cache.index_copy_(0, dst_index, v_cache.index_select(0, src_index))

    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns the sampled token of every request whose prompt is done."""
        if output.block_copies:
            self.copy_slots(output.block_copies)
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
        if self.has_sliding:
            meta.sliding = self._sliding_metadata(output)
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

    def _sliding_metadata(self, output: SchedulerOutput) -> AttentionMetadata:
        """Slots and spans over each request's window blocks in the sliding group."""
        size = self.block_size
        slot_mapping: list[int] = []
        spans = []
        for scheduled in output.scheduled:
            assert scheduled.window_block_ids is not None, "hybrid model without a window table"
            first, block_ids = scheduled.window_block_ids
            start = scheduled.request.num_computed_tokens
            end = start + scheduled.num_new_tokens
            query_start = len(slot_mapping)
            slot_mapping.extend(self._slots(block_ids, start, end, first))
            spans.append(
                plan_span(
                    query_start,
                    end - start,
                    block_ids,
                    start,
                    size,
                    self.device,
                    first_position=first * size,
                )
            )
        return AttentionMetadata(torch.tensor(slot_mapping, device=self.device), spans)

    def _slots(self, block_ids: list[int], start: int, end: int, first: int = 0) -> list[int]:
        """Slot of each position in [start, end); block_ids[0] is block index `first`."""
        size = self.block_size
        return [block_ids[p // size - first] * size + p % size for p in range(start, end)]


def layer_types_of(config) -> tuple[str, ...]:
    """Each layer's attention kind, "full" or "sliding" (architectures without the field: full)."""
    return tuple(getattr(config, "layer_types", None) or ("full",) * config.num_layers)
