"""Run by test_multihost.py under torchrun, one torchrun per network namespace ("host"):
every primitive and send/recv across the hosts. Writes <out_dir>/rank<RANK>.json."""

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checks  # noqa: E402


def main(out_dir):
    rank = int(os.environ["RANK"])
    shown = ("RANK", "GROUP_RANK", "MASTER_ADDR", "RINGCOMM_HOST_ID", "RINGCOMM_SOCKET_IFNAME")
    report = {"fails": [], "env": {k: os.environ.get(k) for k in shown}}
    try:
        import ringcomm

        comm = ringcomm.init(timeout=60)
        nproc = int(os.environ["LOCAL_WORLD_SIZE"])
        ws = comm.world_size
        # torchrun numbers ranks node by node: same node <=> same rank // nproc.
        expect = ["self" if q == rank else "shm" if q // nproc == rank // nproc else "tcp"
                  for q in range(ws)]
        report["transports"] = comm.transports
        if comm.transports != expect:
            report["fails"].append(f"transports {comm.transports}, expected {expect}")
        report["fails"] += checks.collective_matrix(
            comm, dtypes=("float32", "bfloat16", "int64", "uint8", "bool"),
            counts=(0, 1, 7, 1000, checks.BIG), big_dtypes=("float32",), tag="multihost ")
        report["fails"] += checks.p2p_and_barrier(comm, "multihost ")
        ringcomm.finalize()
    except BaseException:
        report["fails"].append("raised:\n" + traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    return 1 if report["fails"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
