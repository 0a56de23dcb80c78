"""The worker processes rank 0 starts itself (worker_launch="spawn"): ranks 1..N-1 on this
machine, each a fresh interpreter (torch.multiprocessing's spawn: no forked torch state), and
what became of them (their exit codes), for the watchdog and for the error a caller gets."""

from __future__ import annotations

import logging

import torch.multiprocessing as mp

from inference.engine.config import EngineConfig
from inference.engine.distributed.worker import run_worker

logger = logging.getLogger(__name__)


class WorkerProcesses:
    def __init__(self, config: EngineConfig, master_port: int) -> None:
        parallel = config.parallel
        context = mp.get_context("spawn")
        self.processes = {
            rank: context.Process(
                target=run_worker,
                kwargs=dict(
                    rank=rank,
                    world_size=parallel.tensor_parallel_size,
                    master_addr=parallel.master_addr,
                    master_port=master_port,
                    local_rank=rank,
                    device_kind=config.device.split(":")[0],
                    timeout_s=parallel.distributed_timeout_s,
                ),
                name=f"tp-rank-{rank}",
                daemon=True,  # never outlives the engine's process
            )
            for rank in range(1, parallel.tensor_parallel_size)
        }
        for process in self.processes.values():
            process.start()

    @property
    def pids(self) -> dict[int, int | None]:
        return {rank: p.pid for rank, p in self.processes.items()}

    def exited(self) -> dict[int, int | None]:
        """Rank → exit code of each worker that is no longer running (negative: its signal)."""
        return {rank: p.exitcode for rank, p in self.processes.items() if not p.is_alive()}

    def describe_exits(self) -> str:
        exited = self.exited()
        return ", ".join(f"rank {rank} exited with code {code}" for rank, code in exited.items())

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the workers to leave (after a Shutdown), then kill what remains."""
        for rank, process in self.processes.items():
            process.join(timeout_s)
            if process.is_alive():
                logger.warning("tensor-parallel rank %d did not exit; killing it", rank)
                process.kill()
                process.join(timeout_s)
