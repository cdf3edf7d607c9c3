"""What a GPU run stands on, for scripts/gpu_check.sh: the CUDA runtime ringcomm
linked (statically) and the driver's CUDA version, torch's CUDA and NCCL versions,
the GPUs each of them sees, and which libnccl.so files this process mapped after
ringcomm and torch loaded NCCL (read from /proc/self/maps).

Every fact is read on its own, so one that fails is printed as such and the rest
still come. The last line is machine-read by gpu_check.sh:

    GPU_FOUND=1 <what was found>     (exit 0)
    GPU_FOUND=0 <why none was found> (exit 3)

A driver too old for ringcomm's CUDA runtime shows as ringcomm seeing no device
while torch (or nvidia-smi) sees one: that is GPU_FOUND=0, never a pass.
"""

import os
import platform
import sys


def _version(v):
    """CUDA's 13000 -> "13.0"."""
    if v == 0:
        return "none (no driver)"
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v > 0 else repr(v)


def _nccl_version(v):
    """NCCL's 22703 (or torch's (2, 27, 3)) -> "2.27.3"."""
    if isinstance(v, tuple):
        return ".".join(map(str, v))
    if isinstance(v, int) and v >= 10000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return repr(v)


def mapped_nccl_libraries(maps="/proc/self/maps"):
    """Paths of the libnccl shared objects mapped into this process, in map order."""
    seen = []
    try:
        with open(maps) as f:
            for line in f:
                path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                if "libnccl" in os.path.basename(path) and path not in seen:
                    seen.append(path)
    except OSError as e:
        return [f"(cannot read {maps}: {e})"]
    return seen


def main():
    facts = {}

    def fact(name, fn):
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - every failure is a fact too
            value = f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        facts[name] = value
        print(f"{name}: {value}", flush=True)
        return value

    fact("python", lambda: f"{sys.version.split()[0]} ({sys.executable})")
    fact("host", lambda: f"{platform.node()} {platform.machine()} {platform.release()}")

    try:
        import ringcomm
        from ringcomm import _C
    except Exception as e:  # noqa: BLE001 - a broken build is reported, not raised
        ringcomm = None
        print(f"ringcomm: FAILED to import: {type(e).__name__}: {e}", flush=True)
    compiled = None
    if ringcomm is not None:
        fact("ringcomm build", ringcomm.build_info)
        compiled = fact("ringcomm GPU path compiled", ringcomm.cuda.compiled)
    if compiled is True:
        v = fact("ringcomm CUDA versions", _C.cuda_versions)
        if isinstance(v, dict):
            print(f"  CUDA runtime (linked into ringcomm): {_version(v.get('runtime'))}; "
                  f"driver supports CUDA {_version(v.get('driver'))}; device query: {v.get('device_query')}",
                  flush=True)
        fact("ringcomm CUDA devices", _C.cuda_device_count)
        fact("ringcomm NCCL (version, path)",
             lambda: (lambda vp: (_nccl_version(vp[0]), vp[1]))(ringcomm.cuda.nccl_version()))
    try:
        import torch
    except ImportError as e:
        facts["torch"] = f"FAILED: {e}"
        print(f"torch: FAILED: {e}")
        torch = None
    if torch is not None:
        fact("torch", lambda: torch.__version__)
        fact("torch CUDA (built with)", lambda: torch.version.cuda)
        fact("torch sees CUDA", torch.cuda.is_available)
        if torch.version.cuda:
            fact("torch NCCL", lambda: _nccl_version(torch.cuda.nccl.version()))
        if facts.get("torch sees CUDA") is True:
            fact("torch devices", lambda: [
                f"{i}: {torch.cuda.get_device_name(i)} sm_{''.join(map(str, torch.cuda.get_device_capability(i)))} "
                f"{torch.cuda.get_device_properties(i).total_memory >> 30} GiB" for i in range(torch.cuda.device_count())])
            fact("torch CUDA init", lambda: str(torch.zeros(1, device="cuda").device))
    libs = mapped_nccl_libraries()
    print("libnccl mapped into this process (after ringcomm and torch loaded NCCL):", flush=True)
    for p in libs or ["(none)"]:
        print(f"  {p}", flush=True)

    ring_devices = facts.get("ringcomm CUDA devices")
    torch_cuda = facts.get("torch sees CUDA")
    if ringcomm is None:
        verdict = "GPU_FOUND=0 ringcomm does not import (see above)"
    elif compiled is not True:
        verdict = "GPU_FOUND=0 this ringcomm build has no GPU path (no CUDA toolkit at build time)"
    elif isinstance(ring_devices, int) and ring_devices > 0 and torch_cuda is True:
        verdict = f"GPU_FOUND=1 {ring_devices} device(s): {facts.get('torch devices')}"
    elif torch_cuda is True:
        verdict = ("GPU_FOUND=0 torch sees a GPU but ringcomm does not: the driver is probably too old for "
                   f"ringcomm's CUDA runtime ({facts.get('ringcomm CUDA versions')})")
    elif isinstance(ring_devices, int) and ring_devices > 0:
        verdict = "GPU_FOUND=0 ringcomm sees a GPU but torch has no CUDA (a CPU build of torch?)"
    else:
        verdict = "GPU_FOUND=0 no GPU found (neither ringcomm nor torch sees a CUDA device)"
    print(verdict, flush=True)
    return 0 if verdict.startswith("GPU_FOUND=1") else 3


if __name__ == "__main__":
    sys.exit(main())
