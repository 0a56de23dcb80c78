"""ModelRunner: turns a SchedulerOutput into one flattened batch, runs the model, samples.

It owns the model and the KV cache tensors; the scheduler owns which slots are whose. The KV
cache of every layer is a view of one stacked tensor (num_layers, 2, num_slots, n_kv_heads,
head_dim), so copies of slots (copy-on-write, window checkpoints) take one call for all layers.
A hybrid model's layers come in two KV groups: full-attention layers index the full group's
slots, sliding-window layers their own (smaller in use, not in size) sliding group's, and get
their own metadata (`meta.sliding`) listing only the blocks of each request's window.
On the kernel path (triton: CUDA, or CPU under the interpreter) it builds block tables and
lengths instead of the torch path's spans, and replays decode steps from CUDA graphs.

Before the forward it copies the partial blocks of token-exact reuse (copy-on-write): all
sources are read before any destination is written, in one gather and one scatter per layer.
"""

from __future__ import annotations

import torch

from inference.engine.attention import AttentionMetadata, plan_shared_prefix, plan_span
from inference.engine.decode_windows import DecodeBatch, plan_decode_batch, slot_runs
from inference.engine.kernels.metadata import ScheduledSpan, build_kernel_metadata
from inference.engine.models import LoadedModel
from inference.engine.partial_blocks import BlockCopy
from inference.engine.request import Request
from inference.engine.request_errors import RequestError
from inference.engine.sampler import sample
from inference.engine.scheduler_output import SchedulerOutput
from inference.engine.structured_output import StructuredOutputManager


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        structured: StructuredOutputManager,
        *,
        dtype: torch.dtype = torch.float32,
        use_kernels: bool = False,
        cuda_graph_max_len: int | None = None,  # the longest sequence a graph serves; None: off
        max_num_seqs: int = 1,
        decode_windows: bool = True,
    ) -> None:
        self.model = loaded.model.to(dtype)
        self.device = device
        self.block_size = block_size
        self.structured = structured
        self.use_kernels = use_kernels
        self.decode_windows = decode_windows and not use_kernels
        if use_kernels:
            from inference.engine.kernels._common import check_device

            check_device(device)  # on CPU: refuses unless the interpreter is on
        cfg = loaded.config
        layer_types = layer_types_of(cfg)
        self.has_sliding = "sliding" in layer_types
        self.sliding_window = getattr(cfg, "sliding_window", None)
        # One pair of tensors per layer; both groups have num_blocks blocks (see llm_engine).
        num_slots = num_blocks * block_size
        shape = (len(layer_types), 2, num_slots, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.graphs = None
        # A graph records one set of block tables; sliding-window layers with their own window
        # tables (hybrid models) would need a second set, not recorded yet: those run eagerly.
        if use_kernels and device.type == "cuda" and cuda_graph_max_len and not self.has_sliding:
            from inference.engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(block_size, cuda_graph_max_len, max_num_seqs, device)
            self.graphs.capture(self.model, self.kv_caches)
        self.layer_types = layer_types

    @torch.inference_mode()
    def copy_blocks(self, copies: list[BlockCopy]) -> None:
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

    def execute(self, output: SchedulerOutput) -> dict[str, int | RequestError]:
        """Run one step; returns the sampled token of every request whose prompt is done (or
        the RequestError of one whose sampling or grammar failed)."""
        if self.device.type == "cuda":
            # Per thread: triton launches on the current device, and this is the loop thread.
            torch.cuda.set_device(self.device)
        if output.block_copies:
            self.copy_blocks(output.block_copies)
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        spans = []
        sampling: list[Request] = []
        logits_rows: list[int] = []
        kernel_spans: list[ScheduledSpan] = []
        decode = self._plan_decode_batch(output) if self.decode_windows else None
        # The decode windows read a head shared by the decoding sequences once already.
        shared = None if self.use_kernels or decode else self._plan_shared_prefix(output)
        for index, scheduled in enumerate(output.scheduled):
            request = scheduled.request
            start = request.num_computed_tokens
            end = start + scheduled.num_new_tokens
            tokens = request.all_token_ids
            query_start = len(input_ids)
            input_ids.extend(tokens[start:end])
            positions.extend(range(start, end))
            slot_mapping.extend(self._slots(scheduled.block_ids, start, end))
            if end == request.num_tokens:
                sampling.append(request)
                logits_rows.append(len(input_ids) - 1)
            if self.use_kernels:
                kernel_spans.append(
                    ScheduledSpan(query_start, end - start, start, scheduled.block_ids)
                )
                continue
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

        if self.graphs is not None and self.graphs.can_run(kernel_spans, len(sampling)):
            logits = self.graphs.run(input_ids, positions, slot_mapping, kernel_spans)
        else:
            meta = AttentionMetadata(
                torch.tensor(slot_mapping, device=self.device), spans, shared[0] if shared else None
            )
            meta.decode = decode
            if self.use_kernels:
                meta.kernel = build_kernel_metadata(kernel_spans, self.block_size, self.device)
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
        logits = logits.float()  # sampling and grammar masks work in fp32, whatever the model's
        failed = self.structured.apply(logits, [r.grammar for r in sampling])
        tokens = sample(
            logits, [r.sampling_params for r in sampling], [r.generator for r in sampling]
        )
        for row, error in failed.items():
            tokens[row] = error
        return {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}

    def copy_slots(self, src_slots: list[int], dst_slots: list[int]) -> None:
        """Copy KV slots in every layer's K and V at once: the copy-on-write of a partly filled
        block, or a sliding-window checkpoint saved or restored (the kernel on CUDA)."""
        from inference.engine.kernels.copy_slots import copy_slots

        cache = self.kv_cache.flatten(0, 1)  # (num_layers * 2, num_slots, n_kv_heads, head_dim)
        src = torch.tensor(src_slots, dtype=torch.long, device=self.device)
        copy_slots(cache, src, torch.tensor(dst_slots, dtype=torch.long, device=self.device))

    def _plan_decode_batch(
        self, output: SchedulerOutput, window: int | None = None
    ) -> DecodeBatch | None:
        """The one-token sequences of this step and the slots of their contexts (their new
        token's included: it is written before attention reads). With a `window`, the
        sliding group's: each sequence's window blocks, from position p - W + 1 on."""
        indices, rows, runs = [], [], []
        query_start = 0
        for index, scheduled in enumerate(output.scheduled):
            if scheduled.num_new_tokens == 1:
                num_slots = scheduled.request.num_computed_tokens + 1
                indices.append(index)
                rows.append(query_start)
                if window is None:
                    runs.append(slot_runs(scheduled.block_ids, num_slots, self.block_size))
                else:
                    first, block_ids = scheduled.window_block_ids
                    lowest = max(0, num_slots - window)
                    runs.append(slot_runs(block_ids, num_slots, self.block_size, first, lowest))
            query_start += scheduled.num_new_tokens
        return plan_decode_batch(indices, rows, runs, self.device, window)

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
        kernel_spans: list[ScheduledSpan] = []
        for scheduled in output.scheduled:
            assert scheduled.window_block_ids is not None, "hybrid model without a window table"
            first, block_ids = scheduled.window_block_ids
            start = scheduled.request.num_computed_tokens
            end = start + scheduled.num_new_tokens
            query_start = len(slot_mapping)
            slot_mapping.extend(self._slots(block_ids, start, end, first))
            if self.use_kernels:
                kernel_spans.append(
                    ScheduledSpan(query_start, end - start, start, block_ids, first_block=first)
                )
                continue
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
        meta = AttentionMetadata(torch.tensor(slot_mapping, device=self.device), spans)
        if self.use_kernels:
            meta.kernel = build_kernel_metadata(
                kernel_spans, size, self.device, window=self.sliding_window
            )
        elif self.decode_windows:
            meta.decode = self._plan_decode_batch(output, window=self.sliding_window)
        return meta

    def _slots(self, block_ids: list[int], start: int, end: int, first: int = 0) -> list[int]:
        """Slot of each position in [start, end); block_ids[0] is block index `first`."""
        size = self.block_size
        return [block_ids[p // size - first] * size + p % size for p in range(start, end)]


def layer_types_of(config) -> tuple[str, ...]:
    """Each layer's attention kind, "full" or "sliding" (architectures without the field: full)."""
    return tuple(getattr(config, "layer_types", None) or ("full",) * config.num_layers)
