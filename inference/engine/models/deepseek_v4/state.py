"""DeepSeek-V4's paged attention state, laid out on the engine's two KV groups.

What a request holds after P tokens, per layer (transformers' DeepseekV4{CSA,HCA}Cache):
the sliding K=V of the last W - 1 tokens; for a compressor layer, ⌊P/rate⌋ compressed entries
(CSA also its indexer's keys) and the P mod rate tokens not yet compressed; for CSA also the
previous window's first series (its windows overlap). Every piece that depends on a single
token lies within the last W = 128 tokens (HCA's buffer is < 128 tokens, CSA's buffer and
overlap < 8), so:

- the **sliding group** (window W, one slot per token) holds each token's K=V and, in
  compressor layers, the token's raw compressor projections (kv and gate, before pooling).
  A window checkpoint at any P therefore holds everything needed to resume at P exactly;
  the buffers and the overlap are not separate records, they are the window's last tokens.
- the **full group** (hash-chained, kept for the whole prefix) holds the compressed entries,
  in their own pools: a CSA layer has block_size / 4 entries per block (entry w in the block of
  token 4w), an HCA layer one entry slot per block (entry w in the block of its last token,
  128w + 127: one block in 128 / block_size holds one). An entry depends only on the tokens
  before its window's end, which the block's chain hash covers.

Copy-on-write of a partial block (token-exact reuse at P inside a block) copies the first
P mod B slots of the window tensors and the entries of the windows that end before P.

The KV tiers (kv/tiers) store a block of either group as one opaque payload (1, B, width):
every row the block owns in each of its group's tensors, flattened and padded to a multiple
of B (the tiers cut payloads into blocks along dim 1). An HCA slot of a block that closes no
window holds nothing the model reads; it travels with the block all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.engine.attention.attention_backend import GroupSpans
from inference.engine.kernels.reference import copy_slots_reference
from inference.engine.kv.partial_blocks import BlockCopy
from inference.engine.models.deepseek_v4.config import CSA, HCA, DeepseekV4Config
from inference.engine.models.deepseek_v4.step_tables import StepTables


@dataclass(slots=True)
class LayerState:
    """One layer's views into the stacked state tensors."""

    window: torch.Tensor  # (num_slots, head_dim): K=V per token
    projections: torch.Tensor | None  # (num_slots, width): compressor inputs per token
    entries: torch.Tensor | None  # (num_entries, head_dim): compressed entries
    index_entries: torch.Tensor | None  # CSA: (num_entries, index_head_dim): indexer keys


class DeepseekV4State:
    """The stacked tensors of every layer's state, their copy-on-write, and the KV tiers'
    block reads and writes."""

    def __init__(
        self,
        config: DeepseekV4Config,
        num_blocks: int,  # full group: compressed entries
        num_window_blocks: int,  # sliding group: per-token window state
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        check_block_size(config, block_size)
        self.block_size = block_size
        num_slots = num_window_blocks * block_size
        kinds = config.attention_kinds
        csa = [i for i, k in enumerate(kinds) if k == CSA]
        hca = [i for i, k in enumerate(kinds) if k == HCA]
        self.csa_entries_per_block = block_size // config.csa_rate

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        hd, ihd = config.head_dim, config.index_head_dim
        num_mtp = min(config.num_mtp_layers, 1)  # the MTP layer's K=V: one more window row
        self.window = zeros(len(kinds) + num_mtp, num_slots, hd)
        self.csa_projections = zeros(len(csa), num_slots, config.projection_width(CSA))
        self.hca_projections = zeros(len(hca), num_slots, config.projection_width(HCA))
        num_csa_entries = num_blocks * self.csa_entries_per_block
        self.csa_entries = zeros(len(csa), num_csa_entries, hd)
        self.csa_index_entries = zeros(len(csa), num_csa_entries, ihd)
        self.hca_entries = zeros(len(hca), num_blocks, hd)
        self.layers: list[LayerState] = []
        for i, kind in enumerate(kinds):
            if kind == CSA:
                j = csa.index(i)
                parts = (self.csa_projections[j], self.csa_entries[j], self.csa_index_entries[j])
            elif kind == HCA:
                j = hca.index(i)
                parts = (self.hca_projections[j], self.hca_entries[j], None)
            else:
                parts = (None, None, None)
            self.layers.append(LayerState(self.window[i], *parts))
        self.mtp_layer = LayerState(self.window[len(kinds)], None, None, None) if num_mtp else None

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Each copy's first num_slots slots (sliding group) or the entries of the windows that
        end within them (full group), from its source block to its destination."""
        size, per_block = self.block_size, self.csa_entries_per_block
        slots = [c for c in copies if c.group == "sliding"]
        if slots:
            src = _index([c.src_block_id * size + i for c in slots for i in range(c.num_slots)])
            dst = _index([c.dst_block_id * size + i for c in slots for i in range(c.num_slots)])
            for cache in (self.window, self.csa_projections, self.hca_projections):
                if cache.shape[0]:
                    copy_slots_reference(cache, src.to(cache.device), dst.to(cache.device))
        entries = [c for c in copies if c.group == "full"]
        if not entries:
            return
        src_ids = [
            c.src_block_id * per_block + i
            for c in entries
            for i in range(c.num_slots * per_block // size)
        ]
        dst_ids = [
            c.dst_block_id * per_block + i
            for c in entries
            for i in range(c.num_slots * per_block // size)
        ]
        for cache in (self.csa_entries, self.csa_index_entries):
            if cache.shape[0] and src_ids:
                copy_slots_reference(
                    cache, _index(src_ids).to(cache.device), _index(dst_ids).to(cache.device)
                )
        whole = [c for c in entries if c.num_slots == size]  # an HCA entry ends a block
        if whole and self.hca_entries.shape[0]:
            src, dst = (
                _index([c.src_block_id for c in whole]),
                _index([c.dst_block_id for c in whole]),
            )
            copy_slots_reference(
                self.hca_entries, src.to(self.hca_entries.device), dst.to(self.hca_entries.device)
            )

    def read_blocks(self, group: str, block_ids: list[int]) -> torch.Tensor:
        """A copy of these blocks' state in the group, on the CPU: (1, len(block_ids) * B,
        width), each block's B rows its own payload."""
        num = len(block_ids)
        parts = []
        for cache, rows, per_block in self._block_rows(group, block_ids):
            layers, _, dim = cache.shape
            picked = cache.index_select(1, rows.to(cache.device))  # (L, n * k, d)
            picked = picked.view(layers, num, per_block, dim).transpose(0, 1)  # (n, L, k, d)
            parts.append(picked.reshape(num, layers * per_block * dim))
        flat = torch.cat(parts, dim=1)  # (n, F): every value the blocks own
        width = self.block_shape(group)[2]
        flat = torch.nn.functional.pad(flat, (0, self.block_size * width - flat.shape[1]))
        return flat.view(1, num * self.block_size, width).to("cpu")

    def write_blocks(self, group: str, block_ids: list[int], payload: torch.Tensor) -> None:
        """Put what read_blocks gave (same shape) into these blocks of the group."""
        num = len(block_ids)
        expected = (1, num * self.block_size, self.block_shape(group)[2])
        if tuple(payload.shape) != expected:
            raise ValueError(f"payload of shape {tuple(payload.shape)}, expected {expected}")
        flat = payload.reshape(num, self.block_size * expected[2])  # (n, B * width)
        start = 0
        for cache, rows, per_block in self._block_rows(group, block_ids):
            layers, _, dim = cache.shape
            end = start + layers * per_block * dim
            part = flat[:, start:end].reshape(num, layers, per_block, dim)
            start = end
            values = part.transpose(0, 1).reshape(layers, num * per_block, dim)
            values = values.to(device=cache.device, dtype=cache.dtype)
            cache.index_copy_(1, rows.to(cache.device), values)

    def block_shape(self, group: str) -> tuple[int, ...]:
        """One block's payload in a group, as read_blocks gives it for one block."""
        values = sum(
            cache.shape[0] * per_block * cache.shape[2]
            for cache, _, per_block in self._block_rows(group, [])
        )
        return (1, self.block_size, -(-values // self.block_size))

    def _block_rows(
        self, group: str, block_ids: list[int]
    ) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """Each tensor of the group, the rows these blocks own in it (block by block) and how
        many rows a block owns."""
        size, per_block = self.block_size, self.csa_entries_per_block
        if group == "sliding":
            slots = _index([b * size + i for b in block_ids for i in range(size)])
            caches = (self.window, self.csa_projections, self.hca_projections)
            return [(cache, slots, size) for cache in caches]
        if group == "full":
            entries = _index([b * per_block + i for b in block_ids for i in range(per_block)])
            return [
                (self.csa_entries, entries, per_block),
                (self.csa_index_entries, entries, per_block),
                (self.hca_entries, _index(block_ids), 1),
            ]
        raise ValueError(f"DeepSeek-V4's state has no KV group {group!r} (full or sliding)")


def check_block_size(config: DeepseekV4Config, block_size: int) -> None:
    if block_size % config.csa_rate or config.hca_rate % block_size:
        raise ValueError(
            f"block_size={block_size} does not fit DeepSeek-V4's compressors: it must be a "
            f"multiple of the CSA rate ({config.csa_rate}) and divide the HCA rate "
            f"({config.hca_rate}), e.g. 16"
        )


def _index(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True, slots=True)
class SequenceState:
    """One scheduled sequence: where its queries are and which blocks hold its state."""

    query_start: int
    query_len: int
    start: int  # tokens computed before this step (its first query's position)
    block_ids: list[int]  # full group: block i covers tokens [i*B, (i+1)*B)
    window_block_ids: list[int]  # sliding group, from block index `first_block` on
    first_block: int
    window_start: int = 0  # a bounded replay's resume point: no window state before it

    @property
    def end(self) -> int:
        return self.start + self.query_len


@dataclass(slots=True)
class DeepseekV4Metadata:
    """A step's sequences, the sliding slot of each new token, and the step's gather tables
    (the same for every layer of the step: each is built once and kept for the step)."""

    sequences: list[SequenceState]
    window_slots: torch.Tensor  # (T,)
    tables: StepTables
    use_kernels: bool = False  # the step runs V4's triton kernels (kernels/v4_*.py)


class DeepseekV4MetadataBuilder:
    """DeepSeek-V4's per-step metadata; with use_kernels its attention runs the triton kernels
    (CUDA, or CPU under the interpreter) instead of their torch references."""

    def __init__(
        self,
        config: DeepseekV4Config,
        block_size: int,
        device: torch.device,
        use_kernels: bool = False,
    ) -> None:
        check_block_size(config, block_size)
        self.use_kernels = use_kernels
        self.block_size = block_size
        self.csa_entries_per_block = block_size // config.csa_rate
        self.window = config.sliding_window
        self.device = device

    def build(self, full: GroupSpans, sliding: GroupSpans | None) -> DeepseekV4Metadata:
        assert sliding is not None, "DeepSeek-V4 keeps its window state in the sliding group"
        sequences = [
            SequenceState(
                f.query_start,
                f.query_len,
                f.num_computed,
                f.block_ids,
                s.block_ids,
                s.first_block,
                s.window_start,
            )
            for f, s in zip(full.spans, sliding.spans, strict=True)
        ]
        tables = StepTables.build(
            sequences, self.block_size, self.csa_entries_per_block, self.window, self.device
        )
        return DeepseekV4Metadata(
            sequences,
            _index(sliding.slot_mapping).to(self.device),
            tables,
            use_kernels=self.use_kernels,
        )
