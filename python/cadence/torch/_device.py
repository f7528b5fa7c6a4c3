# Every device-dependent step of cadence.torch (where a tensor lives, pinned host staging, copies
# between host and device, step timing with CUDA events, host-side waits on accelerator work) goes
# through one object, `ops`, so that the CUDA branches run on a machine without a GPU: the tests
# install a fake (tests/python/torch/_fake_cuda.py) that marks CPU tensors as "on cuda:0" and
# checks that nothing marked reaches a point-to-point call, as Thrust's CPU backends run the same
# source as its CUDA one.
from __future__ import annotations

import time
from typing import Iterable, Optional

import torch
import torch.distributed as dist

CPU = torch.device("cpu")


class DeviceOps:
    """The real operations (CPU and CUDA through torch)."""

    # ---- where tensors live -----------------------------------------------------------------
    def device_of(self, t: torch.Tensor) -> torch.device:
        return t.device

    def is_accelerator(self, device: torch.device) -> bool:
        """True for a device whose kernels run asynchronously to the host (CUDA, and what torch
        exposes through the CUDA API)."""
        return device.type == "cuda"

    def first_accelerator(self, tensors: Iterable[torch.Tensor]) -> Optional[torch.device]:
        for t in tensors:
            d = self.device_of(t)
            if self.is_accelerator(d):
                return d
        return None

    def place(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """t, computed from tensors on `device`, lives there (the identity here; a fake device
        marks it)."""
        return t

    # ---- allocation and copies --------------------------------------------------------------
    def empty(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=device)

    def tensor(self, values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype)
        return t if device.type == "cpu" else t.to(device)

    def host_buffer(self, n: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """A host tensor for point-to-point traffic; pinned (page-locked, from torch's caching
        host allocator) when it stages an accelerator's data, so the copies are DMA."""
        return torch.empty(n, dtype=dtype, pin_memory=bool(pinned))

    def to_host(self, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Copies src into the host tensor out and returns when the data is there (a copy from
        a device waits for the kernels before it on the current stream)."""
        with torch.no_grad():
            out.copy_(src.reshape(-1))
        return out

    def to_device(self, src: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A copy of the host tensor src on device, queued on the current stream (the caching
        host allocator keeps a pinned src alive until the copy has run)."""
        return src.to(device, non_blocking=True)

    def check_host(self, t: torch.Tensor, what: str) -> None:
        """Point-to-point calls over gloo read the tensor's memory on the host: a device tensor
        there is a bug (a device pointer read as a host one), refused before it is sent."""
        if self.device_of(t).type != "cpu":
            raise ValueError(f"{what}: a {self.device_of(t)} tensor reached a gloo point-to-point "
                             "call, which reads host memory; it must be staged through a host "
                             "buffer first")

    # ---- timing -----------------------------------------------------------------------------
    def mark(self, device: Optional[torch.device]):
        """A point in time: on an accelerator, a CUDA event recorded on the device's current
        stream (it completes when the work queued before it has run); else perf_counter()."""
        if device is not None and self.is_accelerator(device):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(device))
            return ev
        return time.perf_counter()

    def seconds_between(self, start, end) -> float:
        """Seconds from mark start to mark end; for events, waits until end has completed."""
        if isinstance(end, float):
            return end - (start if isinstance(start, float) else end)
        if isinstance(start, float):  # a host mark before the first device mark: host time
            end.synchronize()
            return time.perf_counter() - start
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    # ---- collectives ------------------------------------------------------------------------
    def backend(self, group) -> str:
        """The group's backend name, lower case ("gloo", "nccl", "cpu:gloo,cuda:nccl", ...)."""
        return str(dist.get_backend(group)).lower()

    def bound_device(self, group) -> Optional[torch.device]:
        """The device a group was bound to at init (torch >= 2.3's device_id=), else None."""
        d = getattr(group, "bound_device_id", None)
        return d if isinstance(d, torch.device) else None


#: The operations in use; tests replace it inside their spawned processes (install()).
ops: DeviceOps = DeviceOps()


def install(new_ops: DeviceOps) -> DeviceOps:
    """Replaces the device operations (a test seam); returns the previous ones."""
    global ops
    old, ops = ops, new_ops
    return old
