"""--socket: what a plain TCP socket moves between ranks 0 and 1, in the same run.

The reference for ringcomm over TCP, as memcpy is for shared memory: ranks 0
and 1 each send the size's bytes to the other and receive as many, at once
(one thread sends with sendall while the caller receives with recv_into), over
one connection between the addresses ringcomm's TCP transport advertises
(bootstrap.socket_address: the same interface, veth or loopback). That is the
traffic of a send/recv ring at 2 ranks and the per-rank traffic of a ring
all_reduce; the column is size / time, one direction's GB/s (compare with
busbw). At small sizes the time is one exchange of a message each way, the
raw socket's latency (TCP_NODELAY, Python's own cost included: about a
microsecond a call). The other ranks idle meanwhile. A sample's time is the
slower rank's.
"""
from __future__ import annotations

import socket
import threading

import numpy as np

from ringcomm.bench.buffers import aligned_bytes
from ringcomm.bench.timing import Control, Measurement, TimingParams, _schedule, _timed_samples, warm_up


class SocketReference:
    name = "socket"

    def __init__(self, control: Control, store, maxbytes: int, timeout_s: float):
        from ringcomm import bootstrap

        self.control = control
        self.sock = None
        rank = control.rank
        if control.world_size < 2 or rank > 1:
            return
        self.src = aligned_bytes(maxbytes)
        self.dst = aligned_bytes(maxbytes)
        self.src.fill(1)
        addr = bootstrap.socket_address(store)
        if rank == 1:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind((addr, 0))
            server.listen(1)
            store.set("bench/socket_ref", f"{addr}:{server.getsockname()[1]}")
            server.settimeout(timeout_s)
            self.sock, _ = server.accept()
            server.close()
        else:
            store.wait(["bench/socket_ref"])
            host, port = store.get("bench/socket_ref").decode().rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.settimeout(timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _exchange(self, nbytes: int) -> None:
        out = memoryview(self.src)[:nbytes]
        into = memoryview(self.dst)[:nbytes]
        err = []

        def send():
            try:
                self.sock.sendall(out)
            except OSError as e:  # reported by the receiving side's caller
                err.append(e)

        sender = None
        if nbytes <= 65536:
            self.sock.sendall(out)  # fits the socket buffers: no thread needed
        else:
            sender = threading.Thread(target=send)
            sender.start()
        got = 0
        while got < nbytes:
            n = self.sock.recv_into(into[got:], nbytes - got)
            if n == 0:
                raise ConnectionError("the peer closed the reference socket")
            got += n
        if sender is not None:
            sender.join()
        if err:
            raise err[0]

    def measure(self, nbytes: int, p: TimingParams) -> Measurement:
        c = self.control
        n = max(nbytes, 1)
        # Ranks past 1 sit it out (their run is a no-op) but agree on the times.
        run = (lambda: self._exchange(n)) if self.sock is not None else (lambda: None)
        per_call, _ = warm_up(run, p, c.slowest, c.barrier)
        batch, samples = _schedule(per_call, p)
        times = np.zeros(samples)
        if self.sock is not None:
            # Both ends loop alike (the schedule is agreed): an exchange pairs itself up.
            times = _timed_samples(lambda: None, run, lambda: None, batch, samples)
        slowest = c.gather_all(np.asarray(times, dtype=float)).max(axis=0)
        c.barrier()
        return Measurement(samples_s=slowest.tolist(), batch=batch)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
