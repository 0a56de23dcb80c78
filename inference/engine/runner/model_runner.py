"""ModelRunner: turns a SchedulerOutput into one flattened batch (`prepare`: a StepBatch, plain
lists), runs the model on it (`forward`), samples (`sample`). A tensor-parallel engine sends the
StepBatch to its other ranks between the first two (distributed/executor.py).

It owns the model and its paged state (`state`); the scheduler owns which slots are whose.
What the state is comes from the model's config (`paged_state_spec()`, attention/paged_state.py):
the runner allocates it and plans each step's metadata through that spec, whichever model it
runs. A model with a window (sliding) group gets each request's window blocks in their own
metadata (`meta.sliding` for plain paged K/V).

The runner describes each step's sequences once (attention_backend.GroupSpans); the metadata
builder the spec gave it at start (torch path, or the triton kernels: CUDA, or CPU under the
interpreter, where the state has kernels) plans that backend's metadata from them. On the
kernel path on CUDA, decode steps are replayed from CUDA graphs.

Before the forward it copies the partial blocks of token-exact reuse (copy-on-write): all
sources are read before any destination is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from inference.engine.attention.attention_backend import GroupSpans, MetadataBuilder, ScheduledSpan
from inference.engine.attention.paged_state import PagedState, PagedStateSpec
from inference.engine.config import RunnerConfig
from inference.engine.kv.partial_blocks import BlockCopy
from inference.engine.models import LoadedModel
from inference.engine.request import Request
from inference.engine.request_errors import RequestError, RequestNotComputed
from inference.engine.runner.host_allocator import keep_freed_memory
from inference.engine.runner.sampler import sample
from inference.engine.runner.span_check import span_error
from inference.engine.scheduler_output import Sampled, SchedulerOutput
from inference.engine.spec_decode.mtp import mtp_drafts
from inference.engine.structured_output.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepBatch:
    """One step, flattened: what the model reads (and what rank 0 sends a sharded model's
    other ranks: plain lists, no Request objects)."""

    input_ids: list[int]
    positions: list[int]
    full: GroupSpans
    sliding: GroupSpans | None
    logits_rows: list[int]  # rows whose next-token logits are sampled
    block_copies: list[BlockCopy]


@dataclass(slots=True)
class SamplingPlan:
    """What rank 0 samples after a step: the sampling requests, the request of each logits row
    and the draft tokens before it, and (MTP drafting) each position's next token, each
    sampling request's first logits row and its draft."""

    sampling: list[Request]
    row_requests: list[Request]
    row_drafts: list[list[int]]
    next_ids: list[int]
    first_rows: list[int]
    drafts: list[list[int]]
    # Requests left out of the step (their blocks do not cover their span), failed alone.
    not_computed: dict[str, RequestNotComputed]


@dataclass(frozen=True, slots=True)
class RunnerSetup:
    """What the loaded model, the KV budget and the other sub-configs decide for a ModelRunner
    beside its RunnerConfig: rank 0 builds its own from this and sends it to a sharded model's
    other ranks, so every rank has the same blocks."""

    block_size: int
    num_blocks: int
    num_window_blocks: int  # the sliding group's (num_blocks where it has no budget of its own)
    max_model_len: int  # the longest sequence a CUDA graph serves
    max_num_seqs: int
    draft_with_mtp: bool = False  # run the model's MTP layer after each step (its drafts)


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        config: RunnerConfig,  # resolved (EngineConfig): no "auto" left
        setup: RunnerSetup,
        device: torch.device,
        structured: StructuredOutputManager | None,  # None: a worker rank, which never samples
    ) -> None:
        if device.type == "cpu":  # every step's tensors reuse the last step's pages
            logger.info(keep_freed_memory())
        dtype = getattr(torch, config.dtype)
        self.model = loaded.model.to(dtype)
        self.config = config
        self.device = device
        self.block_size = block_size = setup.block_size
        self.structured = structured
        spec = loaded.config.paged_state_spec()
        self.layer_types = spec.layer_types
        self.has_sliding = "sliding" in spec.kv_groups
        self.sliding_window = spec.sliding_window
        use_kernels = config.attention_backend == "triton"
        if use_kernels and not spec.has_attention_kernels:
            # "auto" picks triton on CUDA: say what runs instead.
            logger.warning(
                "attention_backend='triton' has no kernel for %s's attention yet; its "
                "layers run the torch path",
                type(self.model).__name__,
            )
            use_kernels = False
        if use_kernels:
            from inference.engine.kernels._common import check_device

            check_device(device)  # on CPU: refuses unless the interpreter is on
        self.metadata_builder: MetadataBuilder = spec.metadata_builder(
            block_size,
            device,
            use_kernels=use_kernels,
            decode_windows=config.enable_decode_windows,
        )
        state_dtype = spec.state_dtype(dtype, getattr(torch, config.kv_cache_dtype))
        self.state: PagedState | None = spec.allocate(
            setup.num_blocks, setup.num_window_blocks, block_size, state_dtype, device
        )
        self.kv_caches = self.state.layers  # each layer's view: what the forward reads
        if setup.draft_with_mtp and not self.model.has_mtp:
            raise ValueError(f"{type(self.model).__name__} has no MTP layer to draft with")
        self.draft_with_mtp = setup.draft_with_mtp
        self.drafts: dict[str, list[int]] = {}  # the last step's MTP drafts (take_drafts)
        self.mtp_context = None  # what the MTP layer reads, from forward to sample
        self.graphs = None
        if use_kernels and device.type == "cuda" and config.enable_cuda_graphs:
            self._capture_graphs(spec, setup, device)

    def _capture_graphs(self, spec: PagedStateSpec, setup: RunnerSetup, device) -> None:
        if not spec.can_capture_cuda_graphs:
            logger.info(
                "CUDA graphs are off for %s: its paged state's kernels cannot be recorded "
                "(can_capture_cuda_graphs); decode steps run eagerly",
                type(self.model).__name__,
            )
            return
        from inference.engine.runner.cuda_graphs import DecodeGraphs

        self.graphs = DecodeGraphs(
            setup.block_size, setup.max_model_len, setup.max_num_seqs, device
        )
        self.graphs.capture(self.model, self.kv_caches)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Copy each record's first `num_slots` slots from its source block to its destination,
        in every layer of its group (full or sliding)."""
        self.state.copy_blocks(copies)

    # The KV tiers' reads and writes (the PagedState's own, whatever its layout).

    @torch.inference_mode()
    def read_blocks(self, group: str, block_ids: list[int]) -> torch.Tensor:
        """A copy of these blocks' state in every layer of the group, on the CPU."""
        return self.state.read_blocks(group, block_ids)

    @torch.inference_mode()
    def write_blocks(self, group: str, block_ids: list[int], payload: torch.Tensor) -> None:
        """Put what read_blocks gave (same shape) into these blocks of the group."""
        self.state.write_blocks(group, block_ids, payload)

    def block_shape(self, group: str) -> tuple[int, ...]:
        """One block's state in a group, as read_blocks gives it for one block."""
        return self.state.block_shape(group)

    def execute(self, output: SchedulerOutput) -> dict[str, Sampled]:
        """Run one step; returns the sampled token of every request whose prompt is done (or
        the RequestError of one whose sampling or grammar failed). A request with a draft gets
        the model's greedy token at each draft position and the one after (spec_decode):
        one logits row each, masked by its grammar as if the draft before it were accepted."""
        batch, plan = self.prepare(output)
        return self.sample(self.forward(batch), plan)

    def prepare(self, output: SchedulerOutput) -> tuple[StepBatch, SamplingPlan]:
        """The step as flat lists (what every rank of a sharded model runs) and what rank 0
        samples: the request of each logits row, with its draft."""
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
        window = self.sliding_window if self.has_sliding else None
        not_computed: dict[str, RequestNotComputed] = {}
        for scheduled in output.scheduled:
            request = scheduled.request
            error = span_error(scheduled, self.block_size, window)
            if error is not None:
                logger.error("request %s left out of the step: %s", request.request_id, error)
                not_computed[request.request_id] = RequestNotComputed(error)
                continue
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
        batch = StepBatch(input_ids, positions, full, sliding, logits_rows, output.block_copies)
        plan = SamplingPlan(
            sampling, row_requests, row_drafts, next_ids, first_rows, sampling_drafts, not_computed
        )
        return batch, plan

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Copy the step's partial blocks, then run the model: the logits of `logits_rows`
        (on a sharded model's other ranks, an (N, 0) tensor: rank 0 gathers them). A model
        drafting with its MTP layer also keeps what the layer reads (for `sample`)."""
        if self.device.type == "cuda":
            # Per thread: triton launches on the current device, and this is the loop thread.
            torch.cuda.set_device(self.device)
        if batch.block_copies:
            self.copy_blocks(batch.block_copies)
        self.drafts = {}
        self.mtp_context = None
        full, rows = batch.full, batch.logits_rows
        if not batch.input_ids:  # every request of the step was left out (prepare)
            return torch.empty(0, 0, device=self.device)
        if self.graphs is not None and self.graphs.can_run(full.spans, len(rows)):
            return self.graphs.run(batch.input_ids, batch.positions, full.slot_mapping, full.spans)
        logits = self.model(
            torch.tensor(batch.input_ids, device=self.device),
            torch.tensor(batch.positions, device=self.device),
            self.kv_caches,
            self.metadata_builder.build(full, batch.sliding),
            torch.tensor(rows, dtype=torch.long, device=self.device),
            **({"keep_for_draft": True} if self.draft_with_mtp else {}),
        )
        if self.draft_with_mtp:
            logits, self.mtp_context = logits
        return logits

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, plan: SamplingPlan) -> dict[str, Sampled]:
        """Grammar masks, then one token per logits row (rank 0 only); the MTP layer's drafts
        for the next step (`take_drafts`)."""
        context, self.mtp_context = self.mtp_context, None
        sampling, row_requests, row_drafts = plan.sampling, plan.row_requests, plan.row_drafts
        next_ids, first_rows, sampling_drafts = plan.next_ids, plan.first_rows, plan.drafts
        if not sampling:
            if context is not None:
                self._draft_with_mtp(context, next_ids, [], [], [], {})
            return dict(plan.not_computed)
        assert self.structured is not None, "a runner without a structured-output manager"
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
        return {**result, **plan.not_computed}

    def take_drafts(self) -> dict[str, list[int]]:
        """The drafts the MTP layer made in the last step, per request id (once)."""
        drafts, self.drafts = self.drafts, {}
        return drafts

    def _draft_with_mtp(self, context, next_ids, sampling, first_rows, drafts, sampled) -> None:
        self.drafts = mtp_drafts(
            self.model, self.state.mtp_layer, context, next_ids, sampling, first_rows, drafts,
            sampled, self.device,
        )  # fmt: skip

    def close(self) -> None:
        """Let go of the KV cache (its memory is freed once nothing else holds it)."""
        self.kv_caches = []
        self.state = None
        self.graphs = None

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
