"""Attention over the paged KV cache on the torch path, and each backend's per-step metadata.

`attention` (paged attention, prefix and decode), `sliding_attention` (the window),
`decode_windows` (decoding sequences read their contexts together), and the metadata planners:
one per backend (torch here; the triton kernels' planner beside kernels/). The runner picks one
planner at start. Imports torch and the engine's own modules; never triton (that is kernels/).
"""
