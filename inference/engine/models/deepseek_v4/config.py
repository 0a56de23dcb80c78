"""DeepSeek-V4's configuration, read from a checkpoint's config.json (transformers' layout).

Field names follow transformers' `DeepseekV4Config` where they exist there; legacy keys that
older V4 checkpoints still ship (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
`rope_scaling`) are folded in the same way transformers folds them, so one config.json reads
the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.engine.models.deepseek_v4.state_spec import DeepseekV4StateSpec

SLIDING, CSA, HCA = (
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
)
ATTENTION_KINDS = (SLIDING, CSA, HCA)
MLP_KINDS = ("hash_moe", "moe")
_RATIO_TO_KIND = {0: SLIDING, 4: CSA, 128: HCA}


@dataclass(frozen=True, slots=True)
class DeepseekV4Config:
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    q_lora_rank: int
    attention_kinds: tuple[str, ...]  # per layer: SLIDING, CSA or HCA
    mlp_kinds: tuple[str, ...]  # per layer: "hash_moe" or "moe"
    num_experts: int = 256
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    rope_theta: float = 10000.0
    compress_rope: dict[str, Any] = field(default_factory=dict)  # theta + optional yarn
    partial_rotary_factor: float = 64 / 512
    csa_rate: int = 4
    hca_rate: int = 128
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    swiglu_limit: float = 10.0
    sliding_window: int = 128
    o_groups: int = 8
    o_lora_rank: int = 1024
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    tie_word_embeddings: bool = False
    # Multi-token-prediction layers (`num_nextn_predict_layers`; V4 Flash ships one): built and
    # loaded when present, used as the draft of speculative_method="mtp" (deepseek_v4.mtp).
    num_mtp_layers: int = 0

    def __post_init__(self) -> None:
        for name, kinds, allowed in (
            ("layer_types", self.attention_kinds, ATTENTION_KINDS),
            ("mlp_layer_types", self.mlp_kinds, MLP_KINDS),
        ):
            if len(kinds) != self.num_layers:
                raise ValueError(
                    f"{name} lists {len(kinds)} layers; the model has {self.num_layers}"
                )
            bad = sorted(set(kinds) - set(allowed))
            if bad:
                raise ValueError(f"{name} has unknown kinds {bad}; known: {list(allowed)}")
        if self.scoring_func not in ("sqrtsoftplus", "softmax", "sigmoid"):
            raise ValueError(
                f"scoring_func {self.scoring_func!r} is not one of sqrtsoftplus, softmax, sigmoid"
            )
        if self.num_heads * self.head_dim % self.o_groups:
            raise ValueError(
                f"o_groups={self.o_groups} does not divide {self.num_heads} heads x {self.head_dim}"
            )

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> DeepseekV4Config:
        n = int(hf["num_hidden_layers"])
        rates = {CSA: 4, HCA: 128, **(hf.get("compress_rates") or {})}
        rates[CSA] = int(hf.get("compress_rate_csa", rates[CSA]))
        rates[HCA] = int(hf.get("compress_rate_hca", rates[HCA]))
        kinds = hf.get("layer_types")
        if kinds is None and hf.get("compress_ratios") is not None:
            kinds = [_RATIO_TO_KIND[int(r)] for r in hf["compress_ratios"]]
        if kinds is None:  # transformers' default: 2 HCA, then CSA / HCA interleaved
            kinds = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
        mlp_kinds = hf.get("mlp_layer_types")
        if mlp_kinds is None:
            num_hash = int(hf.get("num_hash_layers", 3))
            mlp_kinds = ["hash_moe"] * min(n, num_hash) + ["moe"] * max(0, n - num_hash)
        head_dim = int(hf.get("head_dim", 512))
        partial = hf.get("partial_rotary_factor")
        if partial is None:
            rope_dim = hf.get("qk_rope_head_dim")
            partial = rope_dim / head_dim if rope_dim is not None else 64 / 512
        rope = hf.get("rope_parameters") or {}
        if isinstance(rope.get("compress"), dict):
            main_theta = float(
                rope.get("main", {}).get("rope_theta", hf.get("rope_theta", 10000.0))
            )
            compress = dict(rope["compress"])
        else:  # flat (or legacy rope_scaling): the yarn part belongs to the compress rope
            flat = {**(hf.get("rope_scaling") or {}), **rope}
            main_theta = float(hf.get("rope_theta", 10000.0))
            compress = {k: v for k, v in flat.items() if k not in ("main", "compress")}
            compress["rope_theta"] = float(hf.get("compress_rope_theta", 160000.0))
        rope_type = compress.get("rope_type", compress.get("type", "default"))
        if rope_type not in ("default", "yarn"):
            raise ValueError(f"compress rope_type {rope_type!r} is not supported (default, yarn)")
        compress["rope_type"] = rope_type
        if rope_type == "yarn":
            compress.setdefault("attention_factor", 1.0)  # V4 does not scale cos/sin by mscale
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            moe_intermediate_size=int(hf["moe_intermediate_size"]),
            num_layers=n,
            num_heads=int(hf["num_attention_heads"]),
            head_dim=head_dim,
            q_lora_rank=int(hf["q_lora_rank"]),
            attention_kinds=tuple(kinds[:n]),
            mlp_kinds=tuple(mlp_kinds[:n]),
            num_experts=int(hf.get("n_routed_experts", 256)),
            num_experts_per_tok=int(hf.get("num_experts_per_tok", 6)),
            scoring_func=str(hf.get("scoring_func", "sqrtsoftplus")),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.5)),
            rope_theta=main_theta,
            compress_rope=compress,
            partial_rotary_factor=float(partial),
            csa_rate=rates[CSA],
            hca_rate=rates[HCA],
            hc_mult=int(hf.get("hc_mult", 4)),
            hc_sinkhorn_iters=int(hf.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(hf.get("hc_eps", 1e-6)),
            swiglu_limit=float(hf.get("swiglu_limit", 10.0)),
            sliding_window=int(hf.get("sliding_window", 128)),
            o_groups=int(hf.get("o_groups", 8)),
            o_lora_rank=int(hf.get("o_lora_rank", 1024)),
            index_n_heads=int(hf.get("index_n_heads", 64)),
            index_head_dim=int(hf.get("index_head_dim", 128)),
            index_topk=int(hf.get("index_topk", 512)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 1048576)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            num_mtp_layers=int(hf.get("num_nextn_predict_layers", 0)),
        )

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def rate_of(self, kind: str) -> int:
        return {CSA: self.csa_rate, HCA: self.hca_rate}[kind]

    # ---- what the engine reads of any model config ----------------------------------------

    def paged_state_spec(self) -> DeepseekV4StateSpec:
        """The engine's view of V4's paged state (deepseek_v4.state_spec, which imports this
        module: imported here)."""
        from inference.engine.models.deepseek_v4.state_spec import DeepseekV4StateSpec

        return DeepseekV4StateSpec(self)

    @property
    def num_kv_heads(self) -> int:
        return 1  # shared-KV MQA

    def window_bytes_per_token(self) -> int:
        """fp32 bytes a token holds in the sliding group, across layers: K=V for every layer,
        plus its compressor's raw (kv, gate) projections in CSA and HCA layers; an MTP layer
        keeps its own K=V (sliding attention only)."""
        width = (self.num_layers + min(self.num_mtp_layers, 1)) * self.head_dim
        for kind in self.attention_kinds:
            width += self.projection_width(kind)
        return 4 * width

    def projection_width(self, kind: str) -> int:
        if kind == CSA:  # two series (Ca, Cb) for the main compressor and the indexer
            return 2 * 2 * self.head_dim + 2 * 2 * self.index_head_dim
        if kind == HCA:
            return 2 * self.head_dim
        return 0

    def entry_bytes_per_block(self, block_size: int) -> int:
        """fp32 bytes one full-group block holds: CSA's block_size/4 entries (main + indexer)
        and HCA's one entry slot per block."""
        total = 0
        for kind in self.attention_kinds:
            if kind == CSA:
                total += block_size // self.csa_rate * (self.head_dim + self.index_head_dim)
            elif kind == HCA:
                total += self.head_dim
        return 4 * total
