"""Attention over the paged KV cache on the torch path, and each backend's per-step metadata.

`attention` (paged attention, prefix and decode), `sliding_attention` (the window),
`decode_windows` (decoding sequences read their contexts together), and the metadata planners:
one per backend (torch here; the triton kernels' planner beside kernels/). `paged_state` is the
seam through which every model says what its paged state is (`paged_kv`: plain K/V); the
runner allocates the state and picks one planner at start through it. Imports torch and the
engine's own modules; never triton (that is kernels/).
"""
