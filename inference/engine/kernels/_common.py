"""What the kernel launchers share: the checks every launcher runs before a launch.

Kernels are ordinary `@triton.jit` functions: compiled on CUDA tensors; on CPU tensors they
run only under triton's interpreter, which `TRITON_INTERPRET=1` selects for the whole process
when it is set before triton is first imported (the kernel tests run in such a subprocess).
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreter_active() -> bool:
    """Were triton's kernels (its standard library included) built for the interpreter?"""
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


def check_device(device: torch.device) -> None:
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreter_active():
        return
    raise ValueError(
        f"triton kernels run on CUDA tensors, or on CPU tensors under the interpreter "
        f"(TRITON_INTERPRET=1 set before triton is imported); got tensors on {device}"
    )


def is_interpreted(device: torch.device) -> bool:
    return device.type == "cpu"


def upcast_dot(dtype: torch.dtype, device: torch.device) -> bool:
    """The interpreter multiplies bfloat16 `tl.dot` operands as raw bits (triton issue #11584):
    there, bf16 tiles are widened to fp32 before the dot. Compiled kernels use bf16 tensor
    cores as they are."""
    return dtype == torch.bfloat16 and is_interpreted(device)


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 tl.dot defaults to tf32 on tensor cores (10-bit mantissa): fp32 must stay fp32.
    return "ieee" if dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    inner_contiguous: bool = True,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} like the other inputs")
    if inner_contiguous and t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride()})")
    return t


def check_same(name: str, value: object, expected: object, what: str) -> None:
    if value != expected:
        raise ValueError(f"{name}: {what} is {value}, expected {expected}")


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor, device: torch.device) -> None:
    """K and V caches: (num_slots, n_kv_heads, head_dim), same shape, dtype and strides."""
    check_tensor("k_cache", k_cache, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("v_cache", v_cache, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_same("v_cache", tuple(v_cache.shape), tuple(k_cache.shape), "shape")
    check_same("v_cache", v_cache.dtype, k_cache.dtype, "dtype")
    check_same("v_cache", v_cache.stride(), k_cache.stride(), "stride")
