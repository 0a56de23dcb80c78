"""Triton kernels for the paged KV cache (the engine's GPU path), each beside its launcher and
its torch reference:

- store_kv: a step's K/V into the cache by slot mapping (-1 = padding, skipped)
- decode_attention: one query per sequence, split-K over the context, GQA, optional window
- prefill_attention: new tokens over a cached prefix and themselves, causal, optional window
- copy_slots: copy-on-write of a block and sliding-window checkpoints, a group's layers at once
- metadata: the kernel path's per-step metadata and its builder, which the runner picks
- dispatch: the call a layer's attention makes with that metadata
- reference: the torch references
- quantized_matmul: FP8 block-scaled linear and FP4 grouped experts over DeepSeek's packed
  weights, dequantized a tile at a time in registers
- quantized_dispatch: what a model calls for those (CUDA: the kernels; else the torch path, which
  is their reference)
- v4_sparse_attention: DeepSeek-V4's attention, each query over the pool rows it reads (window
  slots and compressed entries, -1 padded), K = V, with the sinks; split-K for small batches
- v4_indexer, v4_compress: DeepSeek-V4's lightning indexer scores and compressor pooling;
  v4_reference holds their torch references, which are also the V4 torch path's math

The kernel modules import triton; metadata, reference, v4_reference and quantized_dispatch are
plain torch, and the torch paths (inference/engine/attention/attention.py, and DeepSeek-V4's
unless a step's metadata says use_kernels) never import triton. On CPU the kernels run only
under triton's interpreter (TRITON_INTERPRET=1 set before triton is imported), which is how the
test suite checks them.
"""
