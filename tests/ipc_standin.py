"""The cuda_ipc transport's CPU stand-in as a communicator-like object, for tests: the
protocol of csrc/transport/cuda_ipc/ipc_channel.h over host shared memory between the
rank processes (_C_testing._IpcHostComm), with torch.distributed's argument names, on numpy
arrays and torch CPU tensors. Not part of ringcomm's API."""

from ringcomm import _C_testing, cuda_ipc
from ringcomm.reduce_op import op_value

import harness


class IpcStandIn:
    def __init__(self, prefix="ipc", timeout_s=10.0, family="auto", **overrides):
        ctx = harness.context()
        self.rank, self.world_size = ctx.rank, ctx.world_size
        s = cuda_ipc.agree(ctx.store, f"{prefix}/settings", self.rank, timeout_s, cuda_ipc.settings(overrides))
        self.settings = s
        self.family = family
        self.native = _C_testing._IpcHostComm(self.rank, self.world_size, s["slot_bytes"], s["nslots"], s["stage_bytes"],
                                      timeout_s, s["one_shot_max"], s["two_shot_max"])
        cuda_ipc.connect(self.native, ctx.store, prefix, self.rank, self.world_size, timeout_s)

    def all_reduce(self, tensor, op="sum", algo="auto"):
        self.native.all_reduce(tensor, op_value(op), algo, self.family)

    def reduce_scatter(self, output, input, op="sum"):
        self.native.collective("reduce_scatter", output, input, op_value(op), -1, self.family)

    def all_gather(self, output, input):
        self.native.collective("all_gather", output, input, 0, -1, self.family)

    def broadcast(self, tensor, src=0):
        self.native.collective("broadcast", tensor, None, 0, src, self.family)

    def reduce(self, tensor, dst=0, op="sum"):
        self.native.collective("reduce", tensor, None, op_value(op), dst, self.family)

    def scatter(self, output, input=None, src=0):
        self.native.collective("scatter", output, input, 0, src, self.family)

    def gather(self, output, input, dst=0):
        self.native.collective("gather", output, input, 0, dst, self.family)

    def all_to_all(self, output, input):
        self.native.collective("all_to_all", output, input, 0, -1, self.family)

    def send(self, tensor, dst):
        self.native.p2p(tensor, dst, None, -1)

    def recv(self, tensor, src):
        self.native.p2p(None, -1, tensor, src)

    def sendrecv(self, send_tensor, dst, recv_tensor, src):
        self.native.p2p(send_tensor, dst, recv_tensor, src)

    def abort(self, why="aborted by the test"):
        self.native.abort(why)

    def close(self):
        self.native.close()


class Call:
    """checks._case_*'s `call`: one way of calling, the stand-in's methods."""

    def __init__(self, comm):
        self.comm = comm

    def op(self, name):
        return name

    def __call__(self, prim, *args, **kw):
        getattr(self.comm, prim)(*args, **kw)
        return "cuda_ipc stand-in"
