"""megatron-core on a machine without CUDA: tests and development only.

megatron-core assumes CUDA in a few places (../shared/MEGATRON_CPU.md lists them): buffers
made on `torch.cuda.current_device()`, `device="cuda"` scalars, `.cuda()` calls, checks that a
parameter's `type()` is `torch.cuda.FloatTensor`, and CUDA RNG states for dropout, recompute
and seeding. `enable()` redirects all of them to the CPU, process-wide, without editing
megatron's files:

- `torch.cuda.current_device()` answers "cpu", `synchronize` and `empty_cache` do nothing;
- a `TorchFunctionMode` maps every CUDA `device=` argument and `.to("cuda")` to the CPU, makes
  `.cuda()` the identity, and names CPU float tensors `torch.cuda.*` in the no-argument
  `Tensor.type()` megatron checks;
- megatron's CUDA RNG get/set run on the CPU generator, so its named RNG states (the
  tracker behind dropout, recompute and `model_parallel_cuda_manual_seed`) keep working.

The first and last are process-wide; the mode is per thread and per call (`scope()`, and the
`in_every_thread` class decorator on the learner). It is switched on only when CUDA is absent
(`enable()` refuses otherwise), by the Megatron learner's CPU path and by tests; the learner's
own logic never sees it.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
from torch.overrides import TorchFunctionMode

_ENABLED = False


def _cpu(device):
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"  # a bare index means a CUDA device in megatron's calls
    return device


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _cpu(args[1]), *args[2:])
        return func(*args, **kwargs)


def enable() -> None:
    """Redirect megatron's CUDA touch points to the CPU, once per process."""
    global _ENABLED
    if _ENABLED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("training.learners.mcore.cpu redirects CUDA to the CPU: not for a machine with CUDA")
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # megatron's RNG tracker warns when the CPU state moves inside a CUDA fork: here they are one
    logging.getLogger("megatron.core.tensor_parallel.random").addFilter(
        lambda record: "CPU RNG state changed" not in record.getMessage())
    _ENABLED = True


def enabled() -> bool:
    return _ENABLED


@contextlib.contextmanager
def scope():
    """The redirection of tensor calls (`device="cuda"`, `.cuda()`, `type()`) in this thread,
    for the code inside; nothing when `enable()` was not called (a GPU) or it is on already.
    Kept to the learner's own calls, so an engine in the same process never sees it."""
    if not _ENABLED or _active():
        yield
        return
    with _CudaToCpu():
        yield


def in_every_thread(cls):
    """Class decorator: each public method runs with the redirection active in the calling
    thread. Torch function modes are per thread, and the orchestrator steps the learner in a
    worker thread; without CPU redirection (a GPU) the methods are left as they are."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and (not name.startswith("_") or name == "__init__"):
            setattr(cls, name, _scoped(fn))
    return cls


def _scoped(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with scope():
            return fn(*args, **kwargs)
    return run


def _active() -> bool:
    from torch.overrides import _get_current_function_mode_stack

    return any(isinstance(m, _CudaToCpu) for m in _get_current_function_mode_stack())
