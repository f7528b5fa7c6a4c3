# A fake CUDA device for cadence.torch's device layer (cadence.torch._device), so every CUDA branch
# runs on a machine without a GPU: tensors the fake "puts" on the device are CPU tensors it marks
# as living on cuda:0; pinned host buffers are marked too; events are host timestamps. It checks
# what the real device would make fail: a device tensor reaching a gloo point-to-point call (the
# base class's check_host sees the mark), a device copy staged through a buffer that is not
# pinned, an event read before it was synchronized. It counts what it was asked to do.
import collections
import time
import weakref

import torch

from cadence.torch import _device


class _Marks:
    """Tensors by identity (a WeakSet would compare tensors elementwise)."""

    def __init__(self):
        self._refs = {}

    def add(self, t):
        self._refs[id(t)] = weakref.ref(t)
        return t

    def __contains__(self, t):
        r = self._refs.get(id(t))
        return r is not None and r() is t


class FakeEvent:
    def __init__(self, counts):
        self.at = time.perf_counter()
        self.synchronized = False
        self._counts = counts

    def synchronize(self):
        self.synchronized = True
        self._counts["event_syncs"] += 1

    def elapsed_time(self, end):
        assert end.synchronized, "an event's time was read before it was synchronized"
        return (end.at - self.at) * 1000.0


class FakeCuda(_device.DeviceOps):
    DEVICE = torch.device("cuda", 0)

    def __init__(self, backend=None):
        self._device = _Marks()
        self._pinned = _Marks()
        self.backend_name = backend
        self.counts = collections.Counter()

    def put(self, t):
        """t now 'lives on cuda:0'."""
        return self._device.add(t)

    def on_device(self, t) -> bool:
        return t in self._device

    # ---- the DeviceOps interface ----
    def device_of(self, t):
        return self.DEVICE if t in self._device else t.device

    def place(self, t, device):
        return self.put(t) if self.is_accelerator(device) else t

    def empty(self, n, dtype, device):
        return self.place(torch.empty(n, dtype=dtype), device)

    def tensor(self, values, dtype, device):
        return self.place(torch.tensor(values, dtype=dtype), device)

    def host_buffer(self, n, dtype, pinned):
        t = torch.empty(n, dtype=dtype)
        if pinned:
            self.counts["pinned"] += 1
            self._pinned.add(t)
        return t

    def to_host(self, src, out):
        assert out not in self._device, "to_host into a device tensor"
        if src in self._device:
            assert out in self._pinned, "a device-to-host copy into pageable memory"
            self.counts["d2h"] += 1
        with torch.no_grad():
            out.copy_(src.reshape(-1))
        return out

    def to_device(self, src, device):
        assert src in self._pinned, "a host-to-device copy from pageable memory"
        self.counts["h2d"] += 1
        return self.put(src.clone())

    def mark(self, device):
        if device is not None and self.is_accelerator(device):
            self.counts["events"] += 1
            return FakeEvent(self.counts)
        return time.perf_counter()

    def seconds_between(self, start, end):
        if isinstance(end, FakeEvent):
            self.counts["event_reads"] += 1
            end.synchronize()
            if isinstance(start, FakeEvent):
                return start.elapsed_time(end) / 1000.0
            return time.perf_counter() - start
        return super().seconds_between(start, end)

    def backend(self, group):
        return self.backend_name or super().backend(group)


def install(backend=None) -> FakeCuda:
    fake = FakeCuda(backend)
    _device.install(fake)
    return fake


def uninstall() -> None:
    _device.install(_device.DeviceOps())
