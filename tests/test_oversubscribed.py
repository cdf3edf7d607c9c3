"""16 ranks on this machine's 2 cores (issue 12's "without collapse"): every
primitive completes and is right, with the waits yielding rather than spinning.
The time is printed (pytest -s), not asserted: speed is for benchmarks."""

import time

import checks
import harness


def _every_primitive(comm):
    t0 = time.monotonic()
    fails = checks.collective_matrix(comm, dtypes=("float32", "int32"), counts=(1, 1000, 20011),
                                     tag="16 ranks ")
    comm.barrier()
    return {"fails": fails, "seconds": time.monotonic() - t0}


def test_sixteen_ranks_on_two_cores():
    t0 = time.monotonic()
    res = harness.run_ranks(_every_primitive, 16, comm_timeout=120.0, hard_timeout=420, grace=60)
    took = max(r["seconds"] for r in res)
    print(f"16 ranks, every primitive x float32/int32 x 3 sizes: {took:.1f} s of calls, "
          f"{time.monotonic() - t0:.1f} s with the spawn")
    harness.assert_no_failures([r["fails"] for r in res])
