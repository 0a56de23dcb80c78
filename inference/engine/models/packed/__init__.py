"""Weights held as DeepSeek ships them: FP8 linears with block scales, FP4 experts with e8m0
scales.

- `formats.py`: the byte layouts; checks naming the tensor; dequantize; quantize (tests);
- `linear.py`: `Fp8Linear` (and `Fp8GroupedLinear`, V4's block-diagonal output projection);
- `experts.py`: `Fp4Experts`, a layer's routed experts as one packed tensor per projection;
- `dequantized.py`: a packed model's values as a dense state dict (reference comparisons);
- `cpu_tiles.py`: x · Wᵀ on the CPU straight from the packed bytes, a tile of rows at a time.

CPU: each call multiplies from the packed bytes a tile at a time (cpu_tiles), in fp32; the
experts a step routes to, one after another.
CUDA: the triton kernels of `kernels/quantized_matmul.py` (`fp8_block_linear`,
`fp4_grouped_matmul`).
"""
