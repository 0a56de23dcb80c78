"""DeepSeek-V4's paged state as the engine sees it (attention/paged_state.PagedStateSpec):
the window (sliding) group and the compressed entries (full group), with a budget of their
own each; allocated as a DeepseekV4State and planned by DeepseekV4MetadataBuilder
(deepseek_v4.state says what lives where, and why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.attention.paged_state import DType, StateKind
from inference.engine.models.deepseek_v4.config import CSA, HCA, DeepseekV4Config
from inference.engine.models.deepseek_v4.state import (
    DeepseekV4MetadataBuilder,
    DeepseekV4State,
    check_block_size,
)


@dataclass(frozen=True, slots=True)
class DeepseekV4StateSpec:
    config: DeepseekV4Config

    # Every layer keeps a window of K=V and compressor inputs ("sliding"), and a compressor
    # layer its compressed entries for the whole prefix ("full", which also chains the prefix
    # cache: it exists even with no compressor).
    kv_groups = ("full", "sliding")
    # kernels/v4_*.py: sparse attention, the indexer's scores, the compressors' pooling.
    has_attention_kernels = True
    # Their grids follow each step's tables (rows per query, entries closing): not recorded.
    can_capture_cuda_graphs = False
    has_window_budget = True
    # The tiers store both groups' blocks as DeepseekV4State.read_blocks gives them.
    kv_tiers_unsupported = None

    @property
    def layer_types(self) -> tuple[str, ...]:
        return self.config.attention_kinds

    @property
    def sliding_window(self) -> int:
        return self.config.sliding_window

    @property
    def replay_alignment(self) -> int:
        """Where a bounded replay may start: a multiple of every compression rate, so that no
        compressor window is cut (128 for V4)."""
        return max(self.config.csa_rate, self.config.hca_rate)

    def group_block_bytes(self, block_size: int) -> dict[str, int]:
        check_block_size(self.config, block_size)
        return {
            "full": self.config.entry_bytes_per_block(block_size),
            "sliding": block_size * self.config.window_bytes_per_token(),
        }

    def state_kinds(self, block_size: int, itemsize: int) -> tuple[StateKind, ...]:
        config = self.config
        kinds = config.attention_kinds
        num_csa, num_hca = kinds.count(CSA), kinds.count(HCA)
        hd, ihd = config.head_dim, config.index_head_dim
        num_windows = config.num_layers + min(config.num_mtp_layers, 1)
        return (
            StateKind(
                f"sliding window K=V ({num_windows} layers)", "sliding", num_windows * hd * itemsize
            ),
            StateKind(
                f"CSA compressor inputs ({num_csa} layers)",
                "sliding",
                num_csa * config.projection_width(CSA) * itemsize,
            ),
            StateKind(
                f"HCA compressor inputs ({num_hca} layers)",
                "sliding",
                num_hca * config.projection_width(HCA) * itemsize,
            ),
            StateKind(
                f"CSA entries + indexer keys ({num_csa} layers, 1 per {config.csa_rate} tokens)",
                "full",
                num_csa * (hd + ihd) * itemsize / config.csa_rate,
            ),
            StateKind(
                f"HCA entries ({num_hca} layers, a slot per {block_size}-token block)",
                "full",
                num_hca * hd * itemsize / block_size,
            ),
        )

    def state_dtype(self, dtype: DType, kv_cache_dtype: DType) -> DType:
        """The model's dtype: kv_cache_dtype does not apply to this state (the engine logs
        that it was asked for and not used)."""
        return dtype

    def allocate(
        self,
        num_blocks: int,
        num_window_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> DeepseekV4State:
        return DeepseekV4State(
            self.config, num_blocks, num_window_blocks, block_size, dtype, device
        )

    def metadata_builder(
        self,
        block_size: int,
        device: torch.device,
        *,
        use_kernels: bool = False,
        decode_windows: bool = True,  # the torch path's batched windows are V4's own
    ) -> DeepseekV4MetadataBuilder:
        return DeepseekV4MetadataBuilder(self.config, block_size, device, use_kernels=use_kernels)
