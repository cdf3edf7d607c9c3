"""Pipeline parallelism: micro-batches flow through stages, one stage per rank.

Stage s (= comm.rank of S = comm.world_size) receives its input activation from
stage s-1 and sends its output to stage s+1; backward receives the gradient of
its output from s+1 and sends the gradient of its input to s-1. Every activation
is preceded by a small header (dtype and shape) so stages need not agree on shapes
in advance; a gradient has its activation's shape and needs none. Sends are async:
a stage goes on computing while its last output is in flight. Receives block.

Schedules over K micro-batches (F i / B i: forward / backward of micro-batch i):

    gpipe: F0 F1 ... F(K-1) B0 B1 ... B(K-1)
           every stage holds K micro-batches' activations at the peak.
    1f1b:  warm-up of w = min(S-s-1, K) forwards, then alternate F(w+j) B(j),
           then the remaining backwards: stage s holds at most S-s <= S.

Both run all forwards of a micro-batch on stage s before its backward, and keep
the order of micro-batches on every link, so the sends and receives of
neighbouring stages match one for one. With equal stage costs both leave each
stage idle for a fraction (S-1)/(K+S-1) of the step (the bubble).

If the stage module has no_sync() (DataParallel), every backward except the last
runs inside it, so the data-parallel reduction overlaps only the last backward and
runs once per step.
"""
import contextlib
import time

import torch

SCHEDULES = ("gpipe", "1f1b")
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int8, torch.uint8, torch.bool)
_MAX_DIMS = 6
_HEADER = 2 + _MAX_DIMS  # dtype code, ndim, dims


def schedule_order(schedule, stage, n_stages, n_microbatches):
    """The stage's sequence of ("F", i) / ("B", i) steps."""
    k = n_microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(k)] + [("B", i) for i in range(k)]
    if schedule == "1f1b":
        warm = min(n_stages - stage - 1, k)
        order = [("F", i) for i in range(warm)]
        for j in range(k - warm):
            order += [("F", warm + j), ("B", j)]
        return order + [("B", i) for i in range(k - warm, k)]
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def _split(batch, k, what):
    if batch is None:
        raise ValueError(f"{what} is required on this stage")
    if batch.shape[0] % k:
        raise ValueError(f"{what}: batch of {batch.shape[0]} does not divide into {k} micro-batches")
    return list(batch.chunk(k, dim=0))


class Pipeline:
    """Runs one pipeline stage.

    Args:
        stage_module: this stage's module (one tensor in, one tensor out).
        comm: a communicator over the stages, in stage order (rank s is stage s).
        schedule: "1f1b" or "gpipe".
        n_microbatches: K, micro-batches per step.
        loss_fn: loss_fn(output, target) -> scalar, used on the last stage. The step
            minimises the mean of the micro-batch losses.

    step(inputs, target) runs forward and backward of one batch (inputs on the first
    stage, target on the last; others pass nothing), accumulates the gradients into
    the stage's parameters, and returns the list of micro-batch losses on the last
    stage (None elsewhere). After a step, max_in_flight holds the largest number of
    micro-batches whose forward had run and backward had not, and stats the step's
    step_s, compute_s and wait_s.
    """

    def __init__(self, stage_module, comm, schedule="1f1b", n_microbatches=1, loss_fn=None):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if n_microbatches < 1:
            raise ValueError(f"n_microbatches must be at least 1, got {n_microbatches}")
        self.module = stage_module
        self.comm = comm
        self.schedule = schedule
        self.n_microbatches = n_microbatches
        self.stage, self.n_stages = comm.rank, comm.world_size
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.n_stages - 1
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs loss_fn")
        self.loss_fn = loss_fn
        param = next(stage_module.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.in_flight = 0
        self.max_in_flight = 0
        self.stats = {}
        self.losses = None
        self._sends = []
        self._compute_s = self._wait_s = 0.0

    def reset(self):
        """Forgets the sends in flight (their communicator failed); used by Elastic3D
        before pipe.comm is replaced."""
        self._sends = []
        self.in_flight = 0

    # -- communication ----------------------------------------------------------
    def _isend(self, t, dst):
        self._sends = [w for w in self._sends if not w.is_completed()]
        self._sends.append(self.comm.send(t, dst, async_op=True))

    def _recv(self, buf, src):
        # Blocking: with nothing queued it runs on this thread, a worker hand-off less
        # per message; with sends still in flight it joins them (they progress together).
        t0 = time.perf_counter()
        self.comm.recv(buf, src)
        self._wait_s += time.perf_counter() - t0
        return buf

    def _send_activation(self, y):
        if y.dim() > _MAX_DIMS:
            raise ValueError(f"activations of at most {_MAX_DIMS} dims can be sent, got {y.dim()}")
        if y.dtype not in _DTYPES:
            raise TypeError(f"activation dtype {y.dtype} is not supported")
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1] = _DTYPES.index(y.dtype), y.dim()
        header[2:2 + y.dim()] = torch.tensor(y.shape, dtype=torch.int64)
        self._isend(header.to(self.device), self.stage + 1)
        self._isend(y.detach().contiguous(), self.stage + 1)

    def _recv_activation(self):
        header = self._recv(torch.empty(_HEADER, dtype=torch.int64, device=self.device),
                            self.stage - 1).cpu()
        code, ndim = int(header[0]), int(header[1])
        shape = tuple(int(d) for d in header[2:2 + ndim])
        return self._recv(torch.empty(shape, dtype=_DTYPES[code], device=self.device), self.stage - 1)

    # -- one micro-batch --------------------------------------------------------
    def _forward(self, i):
        if self.is_first:
            x = self._inputs[i]
        else:
            x = self._recv_activation()
            if x.is_floating_point():
                x.requires_grad_(True)
        t0 = time.perf_counter()
        y = self.module(x)
        if self.is_last:
            y = self.loss_fn(y, self._targets[i])
            self.losses.append(y.detach())
        self._compute_s += time.perf_counter() - t0
        if not self.is_last:
            self._send_activation(y)
        self._stash[i] = (x, y)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _backward(self, i, last):
        x, y = self._stash.pop(i)
        if self.is_last:
            y, grad = y / self.n_microbatches, None
        elif y.is_floating_point():
            grad = self._recv(torch.empty(y.shape, dtype=y.dtype, device=self.device), self.stage + 1)
        else:
            y = None
        no_sync = getattr(self.module, "no_sync", None)
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        t0 = time.perf_counter()
        if y is not None and y.requires_grad:
            with ctx:
                torch.autograd.backward(y, grad)
        self._compute_s += time.perf_counter() - t0
        if not self.is_first and x.is_floating_point():
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            self._isend(g.contiguous(), self.stage - 1)
        self.in_flight -= 1

    # -- a step -----------------------------------------------------------------
    def step(self, inputs=None, target=None):
        """Forward and backward of one batch; the last stage returns the micro-batch losses."""
        k = self.n_microbatches
        self._inputs = _split(inputs, k, "inputs") if self.is_first else None
        self._targets = _split(target, k, "target") if self.is_last else None
        self._stash = {}
        self.losses = [] if self.is_last else None
        self.in_flight = self.max_in_flight = 0
        self._compute_s = self._wait_s = 0.0
        t0 = time.perf_counter()
        order = schedule_order(self.schedule, self.stage, self.n_stages, k)
        try:
            for n, (kind, i) in enumerate(order):
                if kind == "F":
                    self._forward(i)
                else:
                    self._backward(i, last=n == len(order) - 1)
            t1 = time.perf_counter()
            for w in self._sends:
                w.wait()
            self._wait_s += time.perf_counter() - t1
        finally:
            self._sends = []
            self._stash = {}
            self._inputs = self._targets = None
        self.stats = {"step_s": time.perf_counter() - t0, "compute_s": self._compute_s,
                      "wait_s": self._wait_s}
        return self.losses
