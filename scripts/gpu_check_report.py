"""Verdicts for scripts/gpu_check.sh's summary.

    python scripts/gpu_check_report.py --sweep SWEEP.txt

reads a ringcomm-bench table (nccl-tests' format) and prints each op's average bus
bandwidth per backend on one line; exit status 1 when any size had wrong elements
or failed calls ("Out of bounds values" other than "0 OK", "Failed calls") or the
table has no result at all.

    python scripts/gpu_check_report.py [--show N] JUNIT.xml

is the verdict on one pytest run, read from its JUnit XML: it prints one line
("12 passed, 0 failed, 0 errors, 0 skipped") and, for a run that is not a pass, the
first N (default 4) tests that failed, erred or were skipped with pytest's reason.
Exit status 0 only when at least one test ran and none failed, erred or was skipped:
on a GPU machine a skipped GPU test means the GPU path was not checked (no device
seen, a driver too old for the CUDA runtime, NCCL missing), which must never read as
green. The one exception is a test that needs more GPUs than one machine of the check
has (its skip reason says "needs two GPUs" / "needs N GPUs"): it is counted apart, as
allowed, and named. A missing or unreadable report (pytest killed at its time limit)
is a failure too.
"""

import re
import sys
import xml.etree.ElementTree as ET

# Skip reasons that do not fail the check: the test needs more GPUs than are here.
ALLOWED_SKIP = re.compile(r"\bneeds (two|three|four|eight|[2-9]|\d\d+) GPUs\b")


def verdict(path, shown=4):
    """(ok, lines)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return False, [f"no readable JUnit report ({type(e).__name__}: {e}); pytest was probably killed at its "
                       "time limit: see its log"]
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    bad, allowed = [], []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        kinds = {child.tag for child in case}
        kind = ("failed" if "failure" in kinds else "errors" if "error" in kinds
                else "skipped" if "skipped" in kinds else "passed")
        why = ""
        if kind != "passed":
            child = case.find({"failed": "failure", "errors": "error", "skipped": "skipped"}[kind])
            text = (child.get("message") or (child.text or "")).strip().splitlines()
            why = text[0][:160] if text else ""
        if kind == "skipped" and ALLOWED_SKIP.search(why):
            allowed.append(f"{name} ({why})")
            continue
        counts[kind] += 1
        if kind != "passed":
            bad.append(f"{kind.rstrip('s') if kind != 'errors' else 'error'}: {name}: {why}")
    total = sum(counts.values())
    head = ", ".join(f"{v} {k}" for k, v in counts.items())
    if allowed:
        head += f", {len(allowed)} skipped as allowed (more GPUs than here): " + "; ".join(allowed)[:200]
    ok = total > 0 and counts["passed"] == total
    lines = [head]
    if total == 0:
        lines.append("no test ran")
    elif counts["skipped"] and not ok:
        lines.append("skipped GPU tests count as failures: the GPU path was not checked")
    lines += bad[:shown]
    if len(bad) > shown:
        lines.append(f"... and {len(bad) - shown} more (see the log)")
    return ok, lines


def sweep_verdict(path):
    """(ok, line) for a bench table: "all_reduce 310.2 ringcomm 352.8 nccl; ..."."""
    try:
        with open(path) as f:
            text = f.read().splitlines()
    except OSError as e:
        return False, f"no sweep table ({e})"
    op, parts, wrong = None, [], []
    for line in text:
        words = line.lstrip("#").split()
        if line.startswith("# ") and words and words[0] in ("all_reduce", "reduce_scatter", "all_gather",
                                                            "broadcast", "reduce", "scatter", "gather",
                                                            "all_to_all", "sendrecv"):
            op = words[0]
        elif "Avg bus bandwidth" in line:
            parts.append(f"{op} {line.split(':', 1)[1].strip()}")
        elif "Out of bounds values" in line and line.split(":", 1)[1].strip() != "0 OK":
            wrong.append(f"{op}: {line.split(':', 1)[1].strip()} wrong elements")
        elif "Failed calls" in line:
            wrong.append(f"{op}: {line.split(':', 1)[1].strip()} failed calls")
    if wrong:
        return False, "wrong results: " + "; ".join(wrong)
    if not parts:
        return False, "the sweep table has no results"
    return True, "avg busbw GB/s: " + "; ".join(parts)


def main(argv):
    if len(argv) == 3 and argv[1] == "--sweep":
        ok, line = sweep_verdict(argv[2])
        print(line)
        return 0 if ok else 1
    shown = 4
    if len(argv) == 4 and argv[1] == "--show" and argv[2].isdigit():
        shown, argv = int(argv[2]), argv[:1] + argv[3:]
    if len(argv) != 2:
        print("usage: gpu_check_report.py [--show N] JUNIT.xml | --sweep SWEEP.txt", file=sys.stderr)
        return 2
    ok, lines = verdict(argv[1], shown)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
