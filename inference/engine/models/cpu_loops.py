"""Where the CPU's compiled loops (numba) stand in for torch ops: the logits head
(models/logits_head.py), DeepSeek-V4's RMS norms and hyper-connections
(deepseek_v4/norms_cpu.py, deepseek_v4/hyper_connections_cpu.py). Each loop is written for fp32
arrays on the CPU and gives no gradient; each caller adds what else its loop needs."""

from __future__ import annotations

import torch


def fp32_cpu_inference(*tensors: torch.Tensor) -> bool:
    """Whether every tensor is fp32 on the CPU and no gradient is asked for."""
    return not torch.is_grad_enabled() and all(
        t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors
    )
