"""Triton kernels for the paged KV cache (the engine's GPU path), each beside its launcher and
its torch reference:

- store_kv: a step's K/V into the cache by slot mapping (-1 = padding, skipped)
- decode_attention: one query per sequence, split-K over the context, GQA, optional window
- prefill_attention: new tokens over a cached prefix and themselves, causal, optional window
- copy_slots: copy-on-write of a block and sliding-window checkpoints, all layers at once
- dispatch: the per-step metadata and the call the engine's attention makes

Importing this package imports triton; the torch path (inference/engine/attention.py) never
does. On CPU the kernels run only under triton's interpreter (TRITON_INTERPRET=1 set before
triton is imported), which is how the test suite checks them.
"""
