"""One model over several processes or machines, with torch.distributed (gloo on CPU, NCCL on
CUDA): tensor parallelism (attention heads, MLP columns and the vocabulary split across ranks)
and, for MoE layers, expert parallelism.

- communicator: the process group and its three collectives (all-reduce, gather to rank 0, the
  step broadcast), each counted;
- parallel_layers: column- and row-parallel linears, the vocabulary-parallel embedding and head;
- sharding: each architecture's plan (what is split, what is replicated, and why);
- messages: what rank 0 sends the workers;
- executor: rank 0's side, where the ModelRunner stands in the engine (step broadcast, failure,
  heartbeat and watchdog);
- worker: ranks 1..N-1 (and their command line); launcher: spawning them on this machine.
"""
