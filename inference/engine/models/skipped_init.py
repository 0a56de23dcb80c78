"""Building a model without torch's default initialisation, for models whose every weight is
then loaded (or that live on the meta device, shapes only).

An nn.Linear or nn.Embedding fills its weight with random numbers as it is built
(`reset_parameters`): 1.9 s of CPU for SmolLM2-135M and 3.0 s for Gemma 3 270M, thrown away by
the load that follows. On the meta device the fill is no cheaper: with no meta kernel for
`normal_`, torch runs its Python reference, whose first call imports torch._dynamo (2.6 s),
once in every process that plans an engine's memory. Inside `skipped_init()` torch.nn.init's
in-place initialisers return their tensor untouched (a torch function mode: this thread only).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

_INITIALISERS = frozenset(
    getattr(torch.nn.init, name)
    for name in dir(torch.nn.init)
    if name.endswith("_") and not name.startswith("_") and callable(getattr(torch.nn.init, name))
)


class _SkipInit(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@contextmanager
def skipped_init() -> Iterator[None]:
    """Modules built inside keep their parameters as allocated (torch.empty: whatever the
    memory held): the caller fills every one of them."""
    with _SkipInit():
        yield
