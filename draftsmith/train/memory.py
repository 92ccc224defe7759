"""Peak memory of a piece of work, on CPU as on GPU (benchmarks and memory tests).

CUDA: torch.cuda.max_memory_allocated over the call, less what was allocated before.
CPU: a TorchDispatchMode counts the bytes of every new storage an op returns and subtracts them
when the storage is freed; the peak is the largest running total (forward AND backward, since
the autograd engine runs under the same mode). Tensors created before the call, and views or
in-place results of them, are not counted.

    with PeakMemory() as mem:
        loss = model(batch); loss.backward()
    print(mem.peak)  # bytes
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class _Tracker(TorchDispatchMode):
    def __init__(self, fake_scalar=None):
        super().__init__()
        self.fake_scalar = fake_scalar
        self.current = 0
        self.peak = 0
        self._seen = WeakIdKeyDictionary()

    def _free(self, nbytes: int) -> None:
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.fake_scalar is not None and func is torch.ops.aten._local_scalar_dense.default:
            return self.fake_scalar  # FakeTensorMode has no values: .item() / float() read this stand-in
        if self.fake_scalar is not None and func is torch.ops.aten.masked_select.default:
            src, mask = args[0], args[1]  # data-dependent size: take the upper bound (every element selected)
            numel = torch.broadcast_shapes(src.shape, mask.shape).numel()
            args, kwargs, func = ([numel],), {"dtype": src.dtype, "device": src.device}, torch.ops.aten.empty.memory_format
        out = func(*args, **(kwargs or {}))
        # outputs sharing an input's storage (views, in-place ops) allocate nothing new
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st in self._seen or st._cdata in inputs:
                    continue
                n = st.nbytes()
                self._seen[st] = n
                weakref.finalize(st, self._free, n)
                self.current += n
                self.peak = max(self.peak, self.current)
        return out


class PeakMemory:
    """Context manager; `.peak` holds the peak bytes allocated inside it (see the module doc)."""

    def __init__(self, device: torch.device | str = "cpu", fake_scalar: float | None = None):
        """fake_scalar: under FakeTensorMode, the value .item()/float()/int() return (metrics only)."""
        self.device = torch.device(device)
        self.fake_scalar = fake_scalar
        self.peak = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._mode = _Tracker(self.fake_scalar)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._mode.__exit__(*exc)
            self.peak = self._mode.peak
