"""The KV cache's bookkeeping: which blocks hold which tokens, for how long, and what a new
prompt can reuse.

`hashing` (block hash chains), `block_pool` (ref-counted blocks, LRU free queue, the hash
index), the cache managers (a coordinator over one manager per attention kind: full, sliding
window), `retention` (where window checkpoints are kept), `partial_blocks` (token-exact
copy-on-write), `breakpoints`, `pinned_heads`, `shared_prefill`, `prefix_reuse`. Block ids and
counts only: no tensors are touched here (the runner copies slots). Imports only the standard
library and the engine's config/core types.
"""
