"""Rank 0's side of a tensor-parallel engine: it stands where the ModelRunner stands in the
engine (execute, close) and runs each step on every rank.

A step: rank 0 flattens it (ModelRunner.prepare), broadcasts the flat batch (RunStep), runs its
own shard while the workers run theirs (the layers' all-reduces keep them in step), gets every
rank's logits in the lm head's gather and samples. Nothing else comes back.

Failure: any error in a collective (a rank that died closes its sockets; one that hangs passes
the timeout) leaves the group out of step for good. The executor then fails: the step's
requests get a TensorParallelError saying which rank is gone, every later step fails the same
way at once, the process group is left and the spawned workers are killed. A new engine
starts a new group. A watchdog thread sees a spawned worker die while the engine is idle, and
sends the idle workers a heartbeat every quarter of the timeout.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
import torch.distributed as dist

from inference.engine.config import EngineConfig
from inference.engine.distributed.communicator import (
    CommStats,
    close_distributed,
    free_port,
    init_distributed,
)
from inference.engine.distributed.launcher import WorkerProcesses
from inference.engine.distributed.messages import Heartbeat, RunStep, Shutdown
from inference.engine.distributed.sharding import shard_model
from inference.engine.models import LoadedModel
from inference.engine.request_errors import RequestError
from inference.engine.runner.model_runner import ModelRunner, RunnerSetup
from inference.engine.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel engine is gone: the engine must be shut down and restarted."""


class TensorParallelExecutor:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        """Start (or wait for) the workers and join the process group as rank 0."""
        if dist.is_initialized():  # checked before anything starts: that group is not ours
            raise RuntimeError(
                "this process already belongs to a torch.distributed group (another "
                "tensor-parallel engine runs here?): shut that engine down first"
            )
        parallel = config.parallel
        self.config = config
        self.failure: TensorParallelError | None = None
        self.runner: ModelRunner | None = None
        self._lock = threading.Lock()  # one collective sequence at a time
        self._stopped = threading.Event()
        self._heartbeat_s = parallel.distributed_timeout_s / 4
        self._last_sent = time.monotonic()
        port = parallel.master_port or free_port(parallel.master_addr)
        spawn = parallel.worker_launch == "spawn"
        self.workers = WorkerProcesses(config, port) if spawn else None
        try:
            self.comm = init_distributed(
                0,
                parallel.tensor_parallel_size,
                parallel.master_addr,
                port,
                device,
                parallel.distributed_timeout_s,
            )
            self.comm.broadcast_message(config)
        except Exception as exc:
            raise self._fail(exc, "while the ranks met") from exc
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)

    def shard(self, loaded: LoadedModel) -> LoadedModel:
        try:
            return shard_model(
                loaded, self.comm, expert_parallel=self.config.parallel.enable_expert_parallel
            )
        except Exception:
            self.close()
            raise

    def attach(self, runner: ModelRunner, setup: RunnerSetup) -> None:
        """Send the workers the runner's setup and wait until every rank has built its own."""
        self.runner = runner
        try:
            self.comm.broadcast_message(setup)
            self.comm.all_reduce(torch.zeros(1, device=self.comm.device))
        except Exception as exc:
            raise self._fail(exc, "while the workers loaded the model") from exc
        self._watchdog.start()

    # ---- what the engine calls (its loop thread) ------------------------------------------

    def execute(self, output: SchedulerOutput) -> dict[str, int | RequestError]:
        assert self.runner is not None, "execute before attach"
        batch, plan = self.runner.prepare(output)
        with self._lock:
            self._check()
            try:
                self._send(RunStep(batch))
                logits = self.runner.forward(batch)
            except Exception as exc:
                raise self._fail(exc, "during a step") from exc
        return self.runner.sample(logits, plan)

    def take_drafts(self) -> dict[str, list[int]]:
        """No MTP drafts here (speculative_method='mtp' is refused with tensor parallelism)."""
        return {}

    def make_comm_stats(self) -> CommStats:
        """Rank 0's collectives since the last reset (steps, heartbeats)."""
        with self._lock:
            return self.comm.make_stats()

    def reset_comm_stats(self) -> None:
        with self._lock:
            self.comm.reset_stats()

    def close(self) -> None:
        """Tell the workers to stop, leave the process group, reap the spawned workers."""
        self._stopped.set()
        with self._lock:
            if self.failure is None:
                try:
                    self._send(Shutdown())
                except Exception:
                    logger.warning("a tensor-parallel worker was gone at shutdown")
                self.failure = TensorParallelError("the tensor-parallel engine is shut down")
                self._leave()
        if self._watchdog.is_alive():
            self._watchdog.join(timeout=10)
        if self.runner is not None:
            self.runner.close()

    # ---- failure ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _send(self, message: object) -> None:
        self.comm.broadcast_message(message)
        self._last_sent = time.monotonic()

    def _fail(self, exc: BaseException, when: str) -> TensorParallelError:
        """(lock held, or before the watchdog runs) The group is out of step: say which rank
        is gone, leave the group, kill the spawned workers."""
        if self.workers is not None:
            time.sleep(0.2)  # a worker that closed its sockets is usually reaped by now
        exits = self.workers.describe_exits() if self.workers is not None else ""
        cause = exits or f"{type(exc).__name__}: {exc}"
        if not exits and "Timed out" in str(exc):
            timeout = self.config.parallel.distributed_timeout_s
            cause = f"a rank did not answer within distributed_timeout_s={timeout:g} s: {cause}"
        self.failure = TensorParallelError(
            f"a rank of the tensor-parallel engine failed {when} ({cause}); its requests fail: "
            "shut this engine down and start a new one"
        )
        logger.error("%s", self.failure)
        self._leave()
        return self.failure

    def _leave(self) -> None:
        close_distributed()
        if self.workers is not None:
            self.workers.stop(timeout_s=5)

    def _watch(self) -> None:
        """Fail the engine when a spawned worker dies; keep idle workers from timing out."""
        while not self._stopped.wait(min(1.0, self._heartbeat_s)):
            with self._lock:
                if self.failure is not None:
                    return
                if self.workers is not None and self.workers.exited():
                    self._fail(RuntimeError("a worker exited"), "while the engine was idle")
                    return
                if time.monotonic() - self._last_sent < self._heartbeat_s:
                    continue
                try:
                    self._send(Heartbeat())
                except Exception as exc:
                    self._fail(exc, "while the engine was idle")
                    return
