"""A worker rank (1..N-1) of a tensor-parallel engine: it joins the process group, takes rank
0's EngineConfig and RunnerSetup, loads its shard of the model and KV cache, then runs each
step rank 0 broadcasts until told to stop. It holds no scheduler and samples nothing.

Started by the engine itself (launcher.WorkerProcesses) or, on other machines, as

    python -m inference.engine.distributed.worker --rank 1 --world-size 2 \\
        --master-addr 10.0.0.1 --master-port 29500

(the engine reads no environment: under torchrun, pass its $RANK, $MASTER_ADDR, ... as these
arguments from a shell).
It exits when rank 0 says so, or when rank 0 is gone: a closed connection fails the wait at
once, a silent one within the timeout (an idle rank 0 sends heartbeats).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from inference.engine.config import EngineConfig
from inference.engine.distributed.communicator import close_distributed, init_distributed
from inference.engine.distributed.messages import Heartbeat, RunStep, Shutdown
from inference.engine.distributed.sharding import shard_model
from inference.engine.loading.shard import Shard
from inference.engine.models import load_model
from inference.engine.runner.model_runner import ModelRunner, RunnerSetup

logger = logging.getLogger(__name__)


def run_worker(
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    local_rank: int,
    device_kind: str,
    timeout_s: float,
) -> None:
    if rank < 1 or rank >= world_size:
        raise ValueError(f"a worker's rank is in [1, {world_size}), got {rank}")
    if device_kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device_kind!r}")
    # The backend follows the device kind (gloo / NCCL): it must be rank 0's.
    device = torch.device(f"cuda:{local_rank}" if device_kind == "cuda" else "cpu")
    comm = init_distributed(rank, world_size, master_addr, master_port, device, timeout_s)
    try:
        config = comm.broadcast_message()
        assert isinstance(config, EngineConfig), f"expected the EngineConfig, got {config!r}"
        if config.device.split(":")[0] != device_kind:
            raise ValueError(
                f"rank 0 runs on {config.device!r}, this worker on {device_kind!r}: start it "
                f"with --device {config.device.split(':')[0]}"
            )
        if config.runner.num_threads:
            torch.set_num_threads(config.runner.num_threads)
        expert_parallel = config.parallel.enable_expert_parallel
        shard = Shard(rank, world_size) if expert_parallel else None  # its experts only
        loaded = load_model(config.model, device, config.seed, shard=shard)
        loaded = shard_model(loaded, comm, expert_parallel=expert_parallel)
        setup = comm.broadcast_message()
        if isinstance(setup, Shutdown):  # rank 0 failed before building its runner
            return
        assert isinstance(setup, RunnerSetup), f"expected a RunnerSetup, got {setup!r}"
        runner = ModelRunner(loaded, config.runner, setup, device, None)
        comm.all_reduce(torch.zeros(1, device=device))  # ready: rank 0 waits for every rank
        logger.info("tensor-parallel rank %d of %d ready", rank, world_size)
        while not isinstance(message := comm.broadcast_message(), Shutdown):
            if isinstance(message, RunStep):
                runner.forward(message.batch)
            else:
                assert isinstance(message, Heartbeat), f"unknown message {message!r}"
    finally:
        close_distributed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True, help="rank 0's address")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--local-rank", type=int, default=0, help="which GPU of this machine")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="rank 0's kind")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (rank 0's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        run_worker(
            rank=args.rank,
            world_size=args.world_size,
            master_addr=args.master_addr,
            master_port=args.master_port,
            local_rank=args.local_rank,
            device_kind=args.device,
            timeout_s=args.timeout,
        )
    except Exception:
        logger.exception("tensor-parallel rank %d failed", args.rank)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
