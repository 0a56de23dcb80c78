"""ModelRunner: turns a SchedulerOutput into one flattened batch, runs the model, samples.

It owns the model and the KV cache tensors; the scheduler owns which slots are whose. The KV
cache of every layer is a view of one stacked tensor (num_layers, 2, num_slots, n_kv_heads,
head_dim) whose rows hold the layers group by group (full, then sliding), so a copy of slots
(copy-on-write, window checkpoints) is one call for all the layers of a group (copy_slots).
A hybrid model's layers come in two KV groups: full-attention layers index the full group's
slots, sliding-window layers their own (smaller in use, not in size) sliding group's, and get
their own metadata (`meta.sliding`) listing only the blocks of each request's window.

The runner describes each step's sequences once (attention_backend.GroupSpans); the metadata
builder of the attention backend it picked at start (torch path, or the triton kernels: CUDA,
or CPU under the interpreter) plans that backend's metadata from them. On the kernel path on
CUDA, decode steps are replayed from CUDA graphs.

Before the forward it copies the partial blocks of token-exact reuse (copy-on-write): all
sources are read before any destination is written.
"""

from __future__ import annotations

import logging

import torch

from inference.engine.attention.attention_backend import GroupSpans, MetadataBuilder, ScheduledSpan
from inference.engine.attention.torch_metadata import TorchMetadataBuilder
from inference.engine.core.request import Request
from inference.engine.core.request_errors import RequestError
from inference.engine.core.scheduler_output import Sampled, SchedulerOutput
from inference.engine.kernels.metadata import KernelMetadataBuilder
from inference.engine.kernels.reference import copy_slots_reference
from inference.engine.kv.partial_blocks import BlockCopy
from inference.engine.models import LoadedModel
from inference.engine.runner.sampler import sample
from inference.engine.spec_decode.mtp import mtp_drafts
from inference.engine.structured_output.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


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
        num_window_blocks: int | None = None,  # the sliding group's, if not num_blocks
        draft_with_mtp: bool = False,  # run the model's MTP layer after each step (its drafts)
    ) -> None:
        self.model = loaded.model.to(dtype)
        self.device = device
        self.block_size = block_size
        self.structured = structured
        cfg = loaded.config
        layer_types = layer_types_of(cfg)
        self.layer_types = layer_types
        self.has_sliding = "sliding" in kv_groups_of(cfg)
        self.sliding_window = getattr(cfg, "sliding_window", None)
        own_state = hasattr(self.model, "allocate_state")  # a model with its own paged state
        self.metadata_builder: MetadataBuilder
        if own_state:
            if use_kernels:  # "auto" picks triton on CUDA: say what runs instead
                logger.warning(
                    "attention_backend='triton' has no kernel for %s's attention yet; its "
                    "layers run the torch path",
                    type(self.model).__name__,
                )
                use_kernels = False
            self.metadata_builder = self.model.metadata_builder(block_size, device)
        elif use_kernels:
            from inference.engine.kernels._common import check_device

            check_device(device)  # on CPU: refuses unless the interpreter is on
            self.metadata_builder = KernelMetadataBuilder(
                block_size, device, sliding_window=self.sliding_window
            )
        else:
            self.metadata_builder = TorchMetadataBuilder(
                block_size,
                device,
                sliding_window=self.sliding_window,
                decode_windows=decode_windows,
            )
        if device.type == "cuda":
            from inference.engine.kernels.copy_slots import copy_slots
        else:
            copy_slots = copy_slots_reference  # the same torch ops, without importing triton
        self._copy_slots = copy_slots
        # Both groups have num_blocks blocks (see llm_engine).
        self.state = None
        if own_state:  # DeepSeek-V4: windows and compressed entries (models/deepseek_v4/state.py)
            self.state = self.model.allocate_state(
                num_blocks, num_window_blocks or num_blocks, block_size, dtype, device
            )
            self.kv_caches = self.state.layers
        else:
            self.kv_cache, self.kv_caches, self.group_caches = allocate_kv_cache(
                layer_types, num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim, dtype, device
            )
        if draft_with_mtp and not getattr(self.model, "has_mtp", False):
            raise ValueError(f"{type(self.model).__name__} has no MTP layer to draft with")
        self.draft_with_mtp = draft_with_mtp
        self.drafts: dict[str, list[int]] = {}  # the last step's MTP drafts (take_drafts)
        self.graphs = None
        # A graph records one set of block tables; sliding-window layers with their own window
        # tables (hybrid models) would need a second set, not recorded yet: those run eagerly.
        if use_kernels and device.type == "cuda" and cuda_graph_max_len and not self.has_sliding:
            from inference.engine.runner.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(block_size, cuda_graph_max_len, max_num_seqs, device)
            self.graphs.capture(self.model, self.kv_caches)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Copy each record's first `num_slots` slots from its source block to its destination,
        in every layer of its group (full or sliding): one copy_slots per group."""
        if self.state is not None:
            self.state.copy_blocks(copies)
            return
        size = self.block_size
        for group, cache in self.group_caches.items():
            mine = [c for c in copies if c.group == group]
            if not mine:
                continue
            src = [c.src_block_id * size + i for c in mine for i in range(c.num_slots)]
            dst = [c.dst_block_id * size + i for c in mine for i in range(c.num_slots)]
            self._copy_slots(cache, self._index(src), self._index(dst))

    def copy_slots(self, src_slots: list[int], dst_slots: list[int]) -> None:
        """Copy KV slots in every layer's K and V at once: the copy-on-write of a partly filled
        block, or a sliding-window checkpoint saved or restored (the kernel on CUDA)."""
        cache = self.kv_cache.flatten(0, 1)  # (num_layers * 2, num_slots, n_kv_heads, head_dim)
        self._copy_slots(cache, self._index(src_slots), self._index(dst_slots))

    def execute(self, output: SchedulerOutput) -> dict[str, Sampled]:
        """Run one step; returns the sampled token of every request whose prompt is done (or
        the RequestError of one whose sampling or grammar failed). A request with a draft gets
        the model's greedy token at each draft position and the one after (spec_decode):
        one logits row each, masked by its grammar as if the draft before it were accepted."""
        if self.device.type == "cuda":
            # Per thread: triton launches on the current device, and this is the loop thread.
            torch.cuda.set_device(self.device)
        if output.block_copies:
            self.copy_blocks(output.block_copies)
        input_ids: list[int] = []
        positions: list[int] = []
        sampling: list[Request] = []
        logits_rows: list[int] = []
        row_requests: list[Request] = []  # the request of each logits row
        row_drafts: list[list[int]] = []  # the draft tokens before each row
        next_ids: list[int] = []  # MTP: each position's next token (-1: known once sampled)
        first_rows: list[int] = []  # MTP: each sampling request's first logits row, as a position
        sampling_drafts: list[list[int]] = []  # each sampling request's draft
        full = GroupSpans([], [])
        sliding = GroupSpans([], []) if self.has_sliding else None
        for scheduled in output.scheduled:
            request = scheduled.request
            draft = scheduled.draft_token_ids
            start = request.num_computed_tokens
            end = start + scheduled.num_new_tokens
            query_start = len(input_ids)
            tokens = request.all_token_ids + draft
            input_ids.extend(tokens[start:end])
            if self.draft_with_mtp:
                next_ids.extend(tokens[start + 1 : end + 1] + [-1] * (end + 1 - len(tokens)))
            positions.extend(range(start, end))
            full.slot_mapping.extend(self._slots(scheduled.block_ids, start, end))
            full.spans.append(ScheduledSpan(query_start, end - start, start, scheduled.block_ids))
            if sliding is not None:
                assert scheduled.window_block_ids is not None, "hybrid model without a window table"
                first, block_ids = scheduled.window_block_ids
                sliding.slot_mapping.extend(self._slots(block_ids, start, end, first))
                sliding.spans.append(
                    ScheduledSpan(
                        query_start,
                        end - start,
                        start,
                        block_ids,
                        first_block=first,
                        window_start=request.replay_start or 0,
                    )
                )
            if end == request.num_tokens + len(draft):
                sampling.append(request)
                first_row = len(input_ids) - 1 - len(draft)
                first_rows.append(first_row)
                sampling_drafts.append(draft)
                for index in range(len(draft) + 1):
                    logits_rows.append(first_row + index)
                    row_requests.append(request)
                    row_drafts.append(draft[:index])

        self.drafts = {}
        context = None
        if self.graphs is not None and self.graphs.can_run(full.spans, len(sampling)):
            logits = self.graphs.run(input_ids, positions, full.slot_mapping, full.spans)
        else:
            logits = self.model(
                torch.tensor(input_ids, device=self.device),
                torch.tensor(positions, device=self.device),
                self.kv_caches,
                self.metadata_builder.build(full, sliding),
                torch.tensor(logits_rows, dtype=torch.long, device=self.device),
                **({"keep_for_draft": True} if self.draft_with_mtp else {}),
            )
            if self.draft_with_mtp:
                logits, context = logits
        if not sampling:
            if context is not None:
                self._draft_with_mtp(context, next_ids, [], [], [], {})
            return {}
        logits = logits.float()  # sampling and grammar masks work in fp32, whatever the model's
        drafts = row_drafts if len(row_requests) > len(sampling) else None
        failed = self.structured.apply(logits, [r.grammar for r in row_requests], drafts)
        tokens = sample(
            logits, [r.sampling_params for r in row_requests], [r.generator for r in row_requests]
        )
        for row, error in failed.items():
            tokens[row] = error
        if drafts is None:
            result = {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}
        else:
            result = _per_request(row_requests, tokens)
        if context is not None:
            self._draft_with_mtp(context, next_ids, sampling, first_rows, sampling_drafts, result)
        return result

    def take_drafts(self) -> dict[str, list[int]]:
        """The drafts the MTP layer made in the last step, per request id (once)."""
        drafts, self.drafts = self.drafts, {}
        return drafts

    def _draft_with_mtp(self, context, next_ids, sampling, first_rows, drafts, sampled) -> None:
        self.drafts = mtp_drafts(
            self.model, self.state.mtp_layer, context, next_ids, sampling, first_rows, drafts,
            sampled, self.device,
        )  # fmt: skip

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    def _slots(self, block_ids: list[int], start: int, end: int, first: int = 0) -> list[int]:
        """Slot of each position in [start, end); block_ids[0] is block index `first`."""
        size = self.block_size
        return [block_ids[p // size - first] * size + p % size for p in range(start, end)]


def _per_request(row_requests: list[Request], tokens: list[int | RequestError]) -> dict:
    """Rows back to requests: one token, or (a draft's rows) the list of them; a request with a
    failed row gets that row's error."""
    rows: dict[str, list[int | RequestError]] = {}
    for request, token in zip(row_requests, tokens, strict=True):
        rows.setdefault(request.request_id, []).append(token)
    result: dict[str, Sampled] = {}
    for request_id, mine in rows.items():
        error = next((t for t in mine if isinstance(t, RequestError)), None)
        result[request_id] = error or (mine if len(mine) > 1 else mine[0])
    return result


def layer_types_of(config) -> tuple[str, ...]:
    """Each layer's attention kind, "full" or "sliding" (architectures without the field: full)."""
    return tuple(getattr(config, "layer_types", None) or ("full",) * config.num_layers)


def kv_groups_of(config) -> tuple[str, ...]:
    """The KV cache groups a model needs: "full" (kept for the whole prefix, hash-chained) and,
    with sliding-window state, "sliding". A model whose layers each keep state of both kinds
    (DeepSeek-V4) says so itself (`kv_groups`); others have one group per layer kind."""
    groups = getattr(config, "kv_groups", None)
    if groups is not None:
        return tuple(groups)
    types = layer_types_of(config)
    return tuple(kind for kind in ("full", "sliding") if kind in types)


def group_block_bytes(config, block_size: int) -> dict[str, int]:
    """fp32 bytes one block of each KV group holds across its layers. A model whose state is
    not plain K/V per token (DeepSeek-V4) says so itself (`kv_group_bytes_per_block`)."""
    if hasattr(config, "kv_group_bytes_per_block"):
        return config.kv_group_bytes_per_block(block_size)
    types = layer_types_of(config)
    per_layer = block_size * config.kv_bytes_per_token_per_layer
    return {kind: per_layer * types.count(kind) for kind in ("full", "sliding") if kind in types}


def allocate_kv_cache(
    layer_types: tuple[str, ...],
    num_slots: int,
    n_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], dict[str, torch.Tensor]]:
    """The stacked cache (num_layers, 2, num_slots, n_kv_heads, head_dim), its rows the full
    layers then the sliding ones; each layer's (K, V) views, in layer order; and each group's
    rows as one (num_group_layers * 2, num_slots, n_kv_heads, head_dim) view, for copy_slots."""
    cache = torch.zeros(
        (len(layer_types), 2, num_slots, n_kv_heads, head_dim), dtype=dtype, device=device
    )
    rows = sorted(range(len(layer_types)), key=lambda layer: layer_types[layer] != "full")
    row_of = {layer: row for row, layer in enumerate(rows)}
    per_layer = [(cache[row_of[i], 0], cache[row_of[i], 1]) for i in range(len(layer_types))]
    num_full = layer_types.count("full")
    groups = {"full": cache[:num_full], "sliding": cache[num_full:]}
    per_group = {name: part.flatten(0, 1) for name, part in groups.items() if part.shape[0]}
    return cache, per_layer, per_group
