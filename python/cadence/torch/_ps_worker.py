# A parameter-server worker over torch.distributed point-to-point calls: push a gradient, get
# back the weights the server's policy lets it start from; pull, rejoin after an eviction,
# finish, and a checkpoint of where it stands. The wire format: _ps_protocol.py; the server:
# _ps_server.py.
from __future__ import annotations

import time
from typing import Optional, Tuple

import torch

from . import _device
from . import _ps_protocol as proto
from ._common import (Deadline, InvalidParameterError, TransportError, WorkerError, check_seconds,
                      flatten_params)
from ._ps_server import _Outbox

#: Every worker's goodbyes in flight (sends not waited for), kept until gloo completes them.
_GOODBYES = _Outbox(-1)


class PSWorker:
    r"""A worker's end: push a gradient, get back the weights the policy lets it start from.

    Args:
        model: the model size (elements) or ``model.parameters()`` (size, dtype and device from
            it; a CUDA model is staged through pinned host buffers).
        dtype: the element type when ``model`` is a size (default float32).
        group, server_rank, tag_base: as the server's.
        reply_timeout: seconds to wait for the server's answer to one push; a parked worker
            legitimately waits for the slowest one, so make it longer than any straggle (or
            than the server's evict_after).
        transfer_timeout: seconds one send may take.
    """

    def __init__(self, model, *, dtype: Optional[torch.dtype] = None, group=None,
                 server_rank: int = 0, reply_timeout: float = 300.0,
                 transfer_timeout: float = 60.0, tag_base: int = proto.DEFAULT_TAG_BASE):
        self._roles = proto.Roles("PSWorker", group, server_rank)
        r = self._roles
        if r.rank == r.server:
            raise InvalidParameterError(f"cadence.torch.PSWorker: rank {r.rank} is the server")
        self.size, mdtype, self.device = proto.model_info("PSWorker", model)
        self.dtype = dtype if dtype is not None else mdtype
        if self.dtype not in proto.DTYPES:
            raise InvalidParameterError(f"cadence.torch.PSWorker: dtype {self.dtype} is not one of "
                                        f"{', '.join(str(d) for d in proto.DTYPES)}")
        self._staged = _device.ops.is_accelerator(self.device)
        self.reply_timeout = check_seconds("PSWorker", "reply_timeout", reply_timeout)
        self.transfer_timeout = check_seconds("PSWorker", "transfer_timeout", transfer_timeout)
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = proto.tags(tag_base)
        self.worker_id = r.slot_of_rank(r.rank)
        self.iteration = 0
        self.rejoins = 0
        self._finished = False
        self._refusal: Optional[str] = None
        self._evicted = False
        self._server_closed = False

    def _who(self) -> str:
        return f"cadence.torch.PSWorker (worker {self.worker_id}, rank {self._roles.rank})"

    def _check_usable(self, op: str) -> None:
        if self._finished:
            raise WorkerError(f"{self._who()}: {op} after finish()")
        if self._refusal is not None:
            raise WorkerError(self._refusal)

    def _send(self, op: str, tensors) -> None:
        dst = self._roles.server_global
        deadline = Deadline(self.transfer_timeout)
        try:
            # Post every send first, then wait: the header and the payload travel back to back
            # instead of one rendezvous after the other.
            works = [proto.send(t, dst, self._roles.group, tag, op) for tag, t in tensors]
            for work in works:
                work.wait(timeout=deadline.remaining())
        except RuntimeError as e:
            raise TransportError(f"{self._who()}: {op} after {self.iteration} iterations: sending to "
                                 f"server rank {self._roles.server} failed: {e}") from e

    def _post_reply(self):
        """The receive of the server's reply header, posted before the request goes out so the
        server's answer never waits for it (the header has a fixed size; the payload's
        receive is posted once the header says what follows)."""
        h = torch.zeros(proto.HEADER_WORDS, dtype=torch.int64)
        return h, proto.recv(h, self._roles.server_global, self._roles.group, self._t_reply,
                             "receive reply header")

    def _collect(self, op: str, posted, into: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, int]:
        """The reply: (the weights in a host tensor, the worker id the server addressed)."""
        src = self._roles.server_global
        grp = self._roles.group
        h, work = posted
        try:
            work.wait(timeout=Deadline(self.reply_timeout).remaining())
        except RuntimeError as e:
            raise TransportError(f"{self._who()}: {op} iteration {self.iteration}: no reply from "
                                 f"server rank {self._roles.server} within {self.reply_timeout:g} s "
                                 f"(reply_timeout): {e}") from e
        status, count, hid = int(h[4]), int(h[3]), int(h[1])
        try:
            if status != proto.OK:
                text = torch.zeros(max(count, 0), dtype=torch.uint8)
                proto.recv(text, src, grp, self._t_reply_data, "receive refusal").wait(
                    timeout=Deadline(self.transfer_timeout).remaining())
                msg = (f"{self._who()}: {op} refused by server rank {self._roles.server}: "
                       f"{bytes(text.tolist()).decode(errors='replace')}")
                if status == proto.EVICTED:
                    self._refusal = msg  # an evicted worker stays evicted (until rejoin())
                    self._evicted = True
                elif status == proto.CLOSED:
                    self._refusal = msg
                    self._server_closed = True
                    self._say_goodbye()  # ends the server's receiver for this rank
                raise WorkerError(msg)
            if count != self.size:
                raise TransportError(f"{self._who()}: the server sent {count} weights; this worker's "
                                     f"model has {self.size}")
            ops = _device.ops
            if (into is None or into.numel() != self.size or into.dtype != self.dtype
                    or ops.device_of(into).type != "cpu" or not into.is_contiguous()):
                into = ops.host_buffer(self.size, self.dtype, pinned=self._staged)
            proto.recv(into.reshape(-1), src, grp, self._t_reply_data, "receive weights").wait(
                timeout=Deadline(self.transfer_timeout).remaining())
            return into, hid
        except RuntimeError as e:
            if isinstance(e, (WorkerError, TransportError)):
                raise
            raise TransportError(f"{self._who()}: {op}: receiving from server rank "
                                 f"{self._roles.server} failed: {e}") from e

    def _deliver(self, host: torch.Tensor, out: Optional[torch.Tensor], device) -> torch.Tensor:
        """The weights where the caller wants them: in `out`, else on `device`."""
        if out is not None:
            if out is not host:
                with torch.no_grad():
                    out.reshape(-1).copy_(host)
            return out
        ops = _device.ops
        return ops.to_device(host, device) if ops.is_accelerator(device) else host

    def pull(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The current weights at once (no policy applies): the starting point. The server
        checks the model size here. On this worker's device unless ``out`` is given."""
        self._check_usable("pull")
        posted = self._post_reply()
        self._send("pull", [(self._t_control, proto.header(proto.PULL, self.worker_id, self.iteration, self.size,
                                                      0, proto.dtype_code(self.dtype)))])
        host, _ = self._collect("pull", posted, out)
        return self._deliver(host, out, self.device)

    def push_pull(self, gradient: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sends ``gradient`` (model-size elements, any shape, on any device), then blocks until
        the policy lets this worker start its next iteration; returns the fresh flat weights
        (in ``out`` when given, else on the gradient's device). Raises WorkerError when the
        server evicted this worker (``rejoin()`` can then bring it back) or closed,
        TransportError naming the server when it is gone."""
        self._check_usable("push_pull")
        ops = _device.ops
        if gradient.numel() != self.size:
            raise InvalidParameterError(f"{self._who()}: gradient of {gradient.numel()} elements for a "
                                        f"model of {self.size}")
        if gradient.dtype != self.dtype:
            raise InvalidParameterError(f"{self._who()}: gradient dtype {gradient.dtype}, model dtype "
                                        f"{self.dtype}")
        device = ops.device_of(gradient)
        if ops.is_accelerator(device):
            g = ops.to_host(gradient, ops.host_buffer(self.size, self.dtype, pinned=True))
        else:
            g = gradient.detach().reshape(-1).contiguous()
        k = self.iteration + 1
        posted = self._post_reply()
        self._send("push_pull", [(self._t_control, proto.header(proto.PUSH, self.worker_id, k, self.size, 0,
                                                           proto.dtype_code(self.dtype))),
                                 (self._t_data, g)])
        self.iteration = k
        host, _ = self._collect("push_pull", posted, out)
        return self._deliver(host, out, device)

    def rejoin(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Takes part again after the server evicted this worker (its ``push_pull`` raised
        WorkerError saying so): the server adds a worker to its controller (``add_worker``: a new
        worker id, starting at the slowest clock) and answers with the current weights, which
        this returns (the new starting point; iterations count from 0 again). Only a living
        worker can rejoin: a process that crashed has left the gloo group for good."""
        if self._finished:
            raise WorkerError(f"{self._who()}: rejoin after finish()")
        if not self._evicted or self._server_closed:
            raise InvalidParameterError(f"{self._who()}: rejoin() is for a worker the server "
                                        "evicted" + (" (the server has closed)" if self._server_closed else ""))
        posted = self._post_reply()
        self._send("rejoin", [(self._t_control, proto.header(proto.JOIN, self.worker_id, self.iteration, self.size,
                                                        0, proto.dtype_code(self.dtype)))])
        host, hid = self._collect("rejoin", posted, out)
        self.worker_id = hid
        self.iteration = 0
        self.rejoins += 1
        self._evicted = False
        self._refusal = None
        return self._deliver(host, out, self.device)

    def finish(self) -> None:
        """Leaves: the server stops counting this worker (releasing whoever waited for it).
        Later calls raise WorkerError. An evicted worker's goodbye is not waited for (it ends
        the server's receiver for this rank); after the server closed, nothing more is sent."""
        if self._finished:
            raise WorkerError(f"{self._who()}: finish() called twice")
        self._finished = True
        if self._server_closed:
            return  # its goodbye went out with the refusal
        if self._evicted:
            self._say_goodbye()
            return
        self._send("finish", [(self._t_control, proto.header(proto.FINISH, self.worker_id, self.iteration))])

    def _say_goodbye(self) -> None:
        """A FINISH the server's receiver for this rank ends on, posted and not waited for (the
        server no longer answers this worker). The send is kept alive by a reaper thread until
        gloo is done with it: a gloo send whose work object is destroyed before it completed
        is dropped (or worse), which would leave the server's receiver to take the next job's
        first message."""
        h = proto.header(proto.FINISH, self.worker_id, self.iteration)
        try:
            work = proto.send(h, self._roles.server_global, self._roles.group, self._t_control, "finish")
        except RuntimeError:
            return  # the server is gone: nothing to say goodbye to
        _GOODBYES.post([work], [h], time.monotonic(), self.worker_id)

    # ---- model helpers --------------------------------------------------------------------
    def pull_into(self, params) -> None:
        """pull() written into the parameters."""
        proto.unflatten_into(flatten_params(params), self.pull())

    def step(self, params) -> None:
        """Pushes the parameters' gradients and writes the weights the server answers with
        into them (one push_pull; staged through host memory for a CUDA model)."""
        params = flatten_params(params)  # a generator (model.parameters()) is read twice
        g = _device.ops.place(proto.flatten_grads(params), self.device)
        proto.unflatten_into(params, self.push_pull(g))

    # ---- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where this worker stands (plain data): its worker id, the iterations it pushed, its
        rejoins, whether the server had evicted it. Save it with the model, the optimizer and
        the data position it belongs to, after ``push_pull`` returned."""
        return dict(kind="PSWorker", version=1, rank=self._roles.rank, size=self.size,
                    dtype=str(self.dtype), worker_id=self.worker_id, iteration=self.iteration,
                    rejoins=self.rejoins, evicted=self._evicted, finished=self._finished)

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()`` in a restarted job, before any request: the next
        ``pull()`` or ``push_pull()`` continues the worker id and the iteration numbering,
        which a server resumed with ``ParameterServer.load_state_dict`` takes from it (a fresh
        server would refuse the numbering as a reordered push). An evicted worker stays
        evicted: ``rejoin()`` brings it back. Raises InvalidParameterError for a checkpoint of
        another rank or another model."""
        here = f"{self._who()}: load_state_dict"
        if not isinstance(sd, dict) or sd.get("kind") != "PSWorker":
            raise InvalidParameterError(f"{here}: not a PSWorker state_dict (kind "
                                        f"{sd.get('kind') if isinstance(sd, dict) else type(sd).__name__!r})")
        if sd.get("rank") != self._roles.rank:
            raise InvalidParameterError(f"{here}: the checkpoint is rank {sd.get('rank')}'s, this is "
                                        f"rank {self._roles.rank}")
        if sd.get("size") != self.size or sd.get("dtype") != str(self.dtype):
            raise InvalidParameterError(f"{here}: the checkpoint's model has {sd.get('size')} "
                                        f"elements of {sd.get('dtype')}, this worker's {self.size} "
                                        f"of {self.dtype}")
        self.worker_id = int(sd["worker_id"])
        self.iteration = int(sd["iteration"])
        self.rejoins = int(sd["rejoins"])
        self._finished = bool(sd["finished"])
        self._evicted = bool(sd["evicted"])
        self._server_closed = False
        self._refusal = (f"{self._who()}: the server had evicted this worker when the checkpoint "
                         "was taken: rejoin() to take part again") if self._evicted else None
