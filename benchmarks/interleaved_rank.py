#!/usr/bin/env python3
"""Run by torchrun in place of the program: renumbers this worker's global rank
from host-contiguous (torchrun's rank = node_rank * nproc_per_node + local_rank)
to interleaved (rank = local_rank * nnodes + node_rank), then execs the program.

    torchrun --nnodes H --node-rank I --nproc-per-node R ... interleaved_rank.py -m ringcomm.bench.cli ARGS
    torchrun ... interleaved_rank.py prog.py ARGS

With 2 hosts x 2 ranks, host 0 runs ranks 0 and 2, host 1 ranks 1 and 3: every
neighbour in rank order is on another host. LOCAL_RANK (the index on this host)
and the rendezvous store stay as torchrun made them; a program that groups ranks
by host from facts it exchanges (as ringcomm does) must see the same hosts.
"""

import os
import sys


def interleaved_rank(env) -> int:
    node, local = int(env["GROUP_RANK"]), int(env["LOCAL_RANK"])
    nproc, world = int(env["LOCAL_WORLD_SIZE"]), int(env["WORLD_SIZE"])
    nodes = int(env.get("GROUP_WORLD_SIZE", world // nproc))
    if nodes * nproc != world:
        raise SystemExit(f"interleaved_rank.py: {world} ranks are not {nodes} hosts x {nproc} "
                         "(interleaving needs the same number of ranks on every host)")
    return local * nodes + node


def main(argv):
    if not argv:
        raise SystemExit("usage: interleaved_rank.py (-m MODULE | SCRIPT) [ARGS...]")
    rank = str(interleaved_rank(os.environ))
    os.environ["RANK"] = rank
    os.environ["ROLE_RANK"] = rank  # one role: its ranks are the global ones
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
