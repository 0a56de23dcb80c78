"""DeepSeek-V4 (Flash), the model the talk is about, in the engine.

- `config.py`: DeepseekV4Config from a checkpoint's config.json, and what the engine reads of it;
- `state.py`: the per-request state paged on the engine's two KV groups, and its metadata;
- `layers.py`, `attention.py`, `moe.py`, `hyper_connections.py`, `model.py`: the architecture,
  bottom-up, checked against transformers' DeepseekV4ForCausalLM;
- `step_tables.py`: a step's per-query gather tables; `query_tiles.py`, `tiled_attention.py`:
  the torch path's attention a tile of consecutive queries at a time;
- `weights.py`: the checkpoint layouts' tensor names → the model's;
- `loader.py`: streaming a checkpoint in, FP8/FP4 kept packed (models/packed/), per rank;
- `packed_checkpoint.py`: writing a packed checkpoint (tests, benches); `held_bytes.py`: what a
  loaded model holds, by kind;
- `tiny.py`: `deepseek-v4-tiny-random`, written once as a checkpoint directory.
"""

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.model import DeepseekV4ForCausalLM

__all__ = ["DeepseekV4Config", "DeepseekV4ForCausalLM"]
