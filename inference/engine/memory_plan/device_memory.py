"""The memory one rank has: CUDA's free memory on its device, or the host's available memory
(shared by the ranks a CPU engine spawns on this machine)."""

from __future__ import annotations

import os

import torch

from inference.engine.config import EngineConfig


def device_memory_bytes(config: EngineConfig) -> int:
    """config.cache.device_memory_bytes when given, else measured now."""
    if config.cache.device_memory_bytes is not None:
        return config.cache.device_memory_bytes
    if config.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {config.device!r} but CUDA is not available here: give the memory per "
                "rank (--device-memory-gib, or device_memory_bytes)"
            )
        free, _ = torch.cuda.mem_get_info(torch.device(config.device))
        return int(free)
    available = host_available_bytes()
    parallel = config.parallel
    if parallel.tensor_parallel_size > 1 and parallel.worker_launch == "spawn":
        return available // parallel.tensor_parallel_size  # the ranks share this host
    return available


def host_available_bytes() -> int:
    """MemAvailable (what can be allocated without swapping), or free pages elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
