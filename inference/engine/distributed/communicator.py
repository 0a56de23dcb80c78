"""The process group of a tensor-parallel engine and the three collectives it uses.

One `Communicator` per rank, built by `init_distributed` (torch.distributed: gloo on CPU, NCCL
on CUDA with a gloo group beside it for the control messages, which are bytes on the CPU):

- `all_reduce`: the sum of every rank's partial result (row-parallel layers, the vocabulary-
  parallel embedding, expert-parallel MoE);
- `gather_to_first`: every rank's slice of the logits, to rank 0, which samples;
- `broadcast_message`: a pickled step (or heartbeat, or shutdown) from rank 0 to the workers.

Every collective fails past the process group's timeout instead of waiting forever, and a peer
that dies closes its sockets, which fails the collective at once (gloo: "Connection closed by
peer"). Each call is counted (calls, bytes, seconds) in the communicator's own stats.
"""

from __future__ import annotations

import datetime
import pickle
import socket
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(slots=True)
class OpStats:
    num_calls: int = 0
    # What crossed this rank's links: its all-reduce input, the broadcast payload (rank 0),
    # the gathered slices (rank 0 receives them; a worker sends its own).
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class CommStats:
    """What one rank's collectives cost since the last reset, by kind."""

    ops: dict[str, OpStats] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return sum(op.num_bytes for op in self.ops.values())

    @property
    def seconds(self) -> float:
        return sum(op.seconds for op in self.ops.values())


class Communicator:
    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device,
        control_group: dist.ProcessGroup | None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._control = control_group  # None: the default group (gloo on CPU)
        self._stats: dict[str, OpStats] = {}

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place."""
        started = time.perf_counter()
        dist.all_reduce(x)
        self._count("all_reduce", x.numel() * x.element_size(), started)
        return x

    def gather_to_first(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's x (same shape on every rank) on rank 0, in rank order; None elsewhere."""
        started = time.perf_counter()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_first else None
        dist.gather(x, parts, dst=0)
        size = x.numel() * x.element_size()
        self._count("gather", size * (self.world_size - 1) if self.is_first else size, started)
        return parts

    def broadcast_message(self, message: object | None = None) -> object:
        """Rank 0's `message` on every rank (pickled: a length, then the bytes)."""
        started = time.perf_counter()
        length = torch.zeros(1, dtype=torch.int64)
        payload = b""
        if self.is_first:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            length[0] = len(payload)
        dist.broadcast(length, src=0, group=self._control)
        buffer = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if self.is_first
            else torch.empty(int(length[0]), dtype=torch.uint8)
        )
        dist.broadcast(buffer, src=0, group=self._control)
        self._count("broadcast", 8 + int(length[0]) if self.is_first else 0, started)
        return message if self.is_first else pickle.loads(buffer.numpy().tobytes())

    def make_stats(self) -> CommStats:
        return CommStats({kind: OpStats(**_fields(op)) for kind, op in self._stats.items()})

    def reset_stats(self) -> None:
        self._stats = {}

    def _count(self, kind: str, num_bytes: int, started: float) -> None:
        op = self._stats.setdefault(kind, OpStats())
        op.num_calls += 1
        op.num_bytes += num_bytes
        op.seconds += time.perf_counter() - started


def _fields(op: OpStats) -> dict:
    return {"num_calls": op.num_calls, "num_bytes": op.num_bytes, "seconds": op.seconds}


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device: torch.device,
    timeout_s: float,
) -> Communicator:
    """Join the process group (blocks until all `world_size` ranks have joined, at most
    `timeout_s`). One tensor-parallel engine per process: torch.distributed's default group is
    per process."""
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a torch.distributed group (another tensor-parallel "
            "engine runs here?): shut that engine down first"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # NCCL binds each rank to its current device
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    control = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return Communicator(rank, world_size, device, control)


def close_distributed() -> None:
    """Leave the process group (a later engine in this process can then start its own)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (for a rendezvous on this machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]
