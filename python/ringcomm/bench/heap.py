"""Bytes a process holds on its C heap, and their peak over a stretch of training.

On the CPU torch allocates every tensor with the C library's allocator and torch has no
memory statistics of its own for the CPU (torch.cuda.max_memory_allocated has no CPU
twin), so a rank's tensor memory is read from glibc: mallinfo2() gives the bytes in use
in every arena (uordblks) plus the bytes of the blocks it mapped whole (hblkhd), memory
handed out and not yet freed -- not what the allocator caches. Python's small objects
live in pymalloc's own arenas and ringcomm's shared segments are mapped, not allocated,
so neither is counted; what is counted beyond tensors is small (a few KiB per step).

HeapPeak samples that figure from hooks: after every module's forward and after every
parameter's gradient is accumulated, and at the calls the training loop makes itself
(sample()), so the peak of a step -- the last forward before the first backward, or a
backward holding activations and gradients at once -- is seen within one module.
"""
import ctypes
import ctypes.util


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_FN = _mallinfo2()


def available():
    """True where the C library has mallinfo2 (glibc 2.33 and newer)."""
    return _FN is not None


def heap_in_use():
    """Bytes allocated with malloc and not yet freed, in every arena, in this process."""
    if _FN is None:
        raise RuntimeError("heap_in_use needs glibc's mallinfo2 (glibc >= 2.33)")
    info = _FN()
    return int(info.uordblks + info.hblkhd)


class HeapPeak:
    """The largest heap_in_use() seen while armed, less `baseline` (bytes).

        probe = HeapPeak(model, baseline=heap_in_use())
        probe.arm(); train_step(); probe.disarm(); probe.peak

    The hooks stay on the module until remove(); they cost nothing while disarmed
    beyond one Python call each."""

    def __init__(self, module, baseline=0):
        from ringcomm.parallel.hooks import weak_hook  # (the hooks must not keep the probe alive)

        self.baseline = baseline
        self.peak = 0
        self._armed = False
        self._handles = []
        for m in module.modules():
            self._handles.append(m.register_forward_hook(self._on_forward))
        for p in module.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(weak_hook(self._on_grad)))

    def _on_forward(self, module, args, output):
        self.sample()

    def _on_grad(self, param):
        self.sample()

    def sample(self):
        if self._armed:
            self.peak = max(self.peak, heap_in_use() - self.baseline)

    def arm(self):
        self._armed = True
        self.sample()

    def disarm(self):
        self.sample()
        self._armed = False

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
