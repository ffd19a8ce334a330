"""The ISA key: what picks the CPU kernels, and so the FP32 fold order, of a floating path on
the interpreter (isa), and each path's bits class on a backend (bits_class): compared bit for bit,
or within the cross-ISA bound off its capture's key. See pq2verify.golden."""

import os
import platform

import numpy as np
import torch

from .. import registry


# --- bits that depend on the CPU (see the module docstring) ----------------------------------
_ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
              "avx512_fp16", "avx512_vnni", "avx_vnni", "avx_ne_convert", "amx_tile", "amx_bf16",
              "amx_fp16", "asimd", "sve", "sve2", "bf16")
# variables that change which CPU kernels oneDNN / MKL pick (ATEN_CPU_CAPABILITY shows in
# torch's capability, OPENBLAS_CORETYPE in numpy's BLAS core)
_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
            "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE")
_REASON = {
    "blas": "the interpreter runs this path's floating tl.dot as numpy float32 matmul (OpenBLAS "
            "sgemm), whose summation order OpenBLAS picks per CPU core type",
    "torch": "torch.matmul on the CPU: ATen, oneDNN and MKL pick the bf16/fp16 GEMM kernel, and "
             "with it the FP32 summation order, by the CPU's instruction set",
    "integer": "INT8 dots are exact and the FP32 epilogue is a fixed sequence of elementwise IEEE "
               "operations: the same bits on every CPU",
    "gpu": "compiled for this GPU architecture; bits are compared on the same key only",
}


def bits_class(key: str, p: registry.Path) -> tuple[str, str]:
    """('isa-dependent' | 'exact', why) for a path's outputs on a backend. This, not the
    manifest's copy of it, decides how a capture is compared: editing a manifest cannot loosen
    a comparison."""
    if key != "interpreter":
        return "exact", _REASON["gpu"]
    if p.arithmetic != "floating":
        return "exact", _REASON["integer"]
    return "isa-dependent", _REASON["torch" if p.name == "cublas" else "blas"]   # cublas: torch.matmul


def _cpu() -> tuple[str, str]:
    """(vendor, space-separated ISA flags that select kernels) from /proc/cpuinfo; 'unknown'
    where it says nothing (isa_difference then never calls two keys equal)."""
    vendor, flags = "unknown", None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = (t.strip() for t in line.partition(":"))
                if not k and (vendor != "unknown" or flags is not None):
                    break           # the first processor's block ends (arm64 prints Features first)
                if k in ("vendor_id", "CPU implementer") and vendor == "unknown":
                    vendor = v
                elif k in ("flags", "Features") and flags is None:
                    flags = set(v.split())
    except OSError:
        pass
    return vendor, "unknown" if flags is None else " ".join(f for f in _ISA_FLAGS if f in flags)


def _blas() -> str:
    """numpy's BLAS library, version and (for OpenBLAS) the core type it chose at run time."""
    import ctypes
    import glob
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{cfg.get('name', '?')} {cfg.get('version', '?')}"
    except Exception:      # numpy's config layout varies between versions: say so, never guess
        name = "unknown"
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs", "*openblas*"))
    for lib in libs:
        dll = ctypes.CDLL(lib)      # already loaded by numpy: the same handle, the same core
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):
            fn = getattr(dll, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return f"{name} core {fn().decode()}"
    return f"{name} core unknown"


def isa() -> dict:
    """What picks the CPU kernels, and so the fold order, of an isa-dependent path here. Two
    machines with equal keys run the same kernels; anything unknown makes keys unequal."""
    vendor, flags = _cpu()
    return {"machine": platform.machine(), "cpu": vendor, "cpu_flags": flags,
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "numpy": np.__version__, "numpy_blas": _blas(),
            "env": {k: os.environ[k] for k in _ISA_ENV if k in os.environ}}


def isa_difference(captured: dict | None, now: dict) -> str:
    """'' if the keys are equal, else what differs, e.g. 'torch_cpu_capability AVX512 -> AVX2'."""
    if not captured:
        return "the capture's ISA was not recorded"
    unknown = sorted(k for k, v in now.items() if "unknown" in str(v))
    if unknown:     # equal keys must mean the same kernels: an incomplete key proves nothing
        return f"this machine's ISA key is incomplete ({', '.join(unknown)} unknown)"
    diff = [f"{k} {captured.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(captured) | set(now))
            if captured.get(k) != now.get(k)]
    return "; ".join(diff)


def _bits_record(key: str, p: registry.Path) -> dict:
    cls, why = bits_class(key, p)
    return {"bits": cls, "bits_reason": why, "isa": isa() if cls == "isa-dependent" else None}
