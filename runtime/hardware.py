"""A fingerprint of this CPU machine: tuned kernel times are valid only where it matches."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

# the ISA extensions the C renderer can use; the rest of /proc/cpuinfo's flags do not change a kernel
ISA_FLAGS = ("avx", "avx2", "avx512f", "fma", "neon")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo; empty where there is none (macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _gcc_version() -> str | None:
    try:
        # -dumpversion after -dumpfullversion: gcc before 7 knows only the latter and prints "6"
        out = subprocess.run(["gcc", "-dumpfullversion", "-dumpversion"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def fingerprint_cpu() -> dict:
    info = _cpuinfo()
    machine = platform.machine()
    flags = set(info.get("flags", "").split()) | set(info.get("Features", "").split())
    # 64-bit ARM always has NEON; Linux lists it there as "asimd"
    if "asimd" in flags or machine in ("aarch64", "arm64"):
        flags.add("neon")
    return {
        "cpu": info.get("model name") or platform.processor() or "unknown",
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "gcc": _gcc_version(),
        "os": platform.system(),
        "machine": machine,
    }


def fingerprint_id(info: dict) -> str:
    canonical = json.dumps(info, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


_PHRASES = {
    "cpu": "cpu {!r}",
    "logical_cores": "{} logical cores",
    "usable_cores": "{} usable cores",
    "isa": "ISA extensions {}",
    "gcc": "gcc {}",
    "os": "OS {}",
    "machine": "machine {}",
}


def _phrase(key: str, value) -> str:
    if value is None:
        return f"no {key}"
    if isinstance(value, list):
        value = "+".join(map(str, value)) or "(none)"
    return _PHRASES.get(key, key + " {!r}").format(value)


def describe_mismatch(expected: dict, actual: dict) -> str | None:
    """One sentence naming what differs, e.g. "built for cpu 'AMD EPYC 7B13', 4 usable cores;
    this machine has cpu 'Intel Xeon', 2 usable cores"; None where the two are equal."""
    keys = [k for k in dict.fromkeys([*expected, *actual]) if expected.get(k) != actual.get(k)]
    if not keys:
        return None
    built = ", ".join(_phrase(k, expected.get(k)) for k in keys)
    here = ", ".join(_phrase(k, actual.get(k)) for k in keys)
    return f"built for {built}; this machine has {here}"


def fingerprint_cuda() -> dict:
    """The GPU a CUDA compile tunes for: name, compute capability, memory, driver and runtime."""
    from .cuda import cupy_or_error
    cp = cupy_or_error()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return {"gpu": props["name"].decode(), "compute_capability": f"{props['major']}.{props['minor']}",
            "gpu_memory": int(props["totalGlobalMem"]), "cuda_driver": cp.cuda.runtime.driverGetVersion(),
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "cupy": cp.__version__}
