"""Running a step on the device: `model_runner` (a scheduler output -> input tensors, the
attention metadata from the chosen planner, the forward pass, KV slot copies, sampling),
`sampler` (greedy, temperature, top-p/top-k, seeds per request), `cuda_graphs` (captured decode
steps on CUDA). Never imports the scheduler: it reads scheduler_output only.
"""
