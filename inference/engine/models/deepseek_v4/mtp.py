"""DeepSeek-V4's multi-token-prediction (MTP) layer, used as the draft of speculative decoding.

The layout is DeepSeek's own (DeepSeek-V4 `inference/model.py`, class MTPBlock; the checkpoint
ships it as `mtp.0.*`, `num_nextn_predict_layers: 1`; transformers does not build it): for the
token at position p, with the main model's residual streams h_p (after its last layer, before
its head: (hc_mult, hidden)) and the embedding of the *next* token t_{p+1},

    x = e_proj(enorm(embed(t_{p+1}))) + h_proj(hnorm(h_p))      # per stream
    x = Block(x)                                                  # one full V4 layer
    logits = lm_head(norm(hc_head(x)))                            # its own hc head and norm

which predicts t_{p+2}. The embedding and lm head are the main model's. Its block is a
standard V4 layer (attention with mHC and a top-k routed MoE) at index num_layers; its
attention is sliding-window only (the checkpoint has no compressor or indexer for it).

Its state: the block's own sliding-window K=V, one more row of the sliding group's window
tensor (deepseek_v4.state), kept by position like every layer's, so copies, checkpoints and
released windows cover it with no code of its own. The K=V at p depends on t_{p+1}: a window
resumed from the prefix cache (or the KV tiers) may hold, at the last position of a cached
block, the K=V of another continuation. That can only change a draft, never the output
(drafts are verified).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import HyperHead
from inference.engine.models.deepseek_v4.layers import RMSNorm, Ropes


class MTPLayer(nn.Module):
    def __init__(self, config: DeepseekV4Config, block: nn.Module) -> None:
        """`block`: a decoder layer with sliding-window attention and a top-k routed MoE."""
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.e_proj = nn.Linear(hidden, hidden, bias=False)
        self.h_proj = nn.Linear(hidden, hidden, bias=False)
        self.enorm = RMSNorm(hidden, eps)
        self.hnorm = RMSNorm(hidden, eps)
        self.norm = RMSNorm(hidden, eps)
        self.hc_head = HyperHead(config)
        self.block = block

    def forward(
        self,
        streams: torch.Tensor,  # (T, hc_mult, hidden): the main model's, after its last layer
        next_embeds: torch.Tensor,  # (T, hidden): embeddings of each position's next token
        next_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        ropes: Ropes,
        state,
        meta,
        rows: torch.Tensor,  # (N,) rows whose hidden states are wanted
    ) -> torch.Tensor:
        e = self.e_proj(self.enorm(next_embeds)).unsqueeze(1)  # (T, 1, hidden)
        x = e + self.h_proj(self.hnorm(streams))  # (T, hc_mult, hidden)
        x = self.block(x, next_ids, positions, ropes, state, meta, rows)  # (N, hc_mult, hidden)
        return self.norm(self.hc_head(x))  # (N, hidden)
