"""Golden captures: frozen output bytes of every path on a fixed set of cases, per backend
(golden/interpreter/, golden/sm90/: GPU and interpreter rounding differ).

A capture directory holds
- inputs.safetensors: the activations and weights of every case (format-1 captures stored only
  weights up to 64 KB and regenerate the others from their seed, which holds only on a host
  whose torch CPU capability gives the same randn bits),
- <path>.safetensors: that path's output of every case, keyed by case id,
- manifest.json: per-file sha256, the cases (each with the sha256 of its x and y), each weight
  as seed + shape + sha256, per path the sha256 of its kernel sources, how its bits may be
  compared ("bits", see below) and the CPU it was captured on ("isa"), torch and triton
  versions, GPU name or 'interpreter', commit and date.

`verify` recomputes every case twice, each run into a fresh output buffer whose storage is
neither the other run's nor the golden's (a kernel that returns or rewrites a buffer it returned
before cannot make a comparison compare a tensor with itself), and compares the whole output with
the capture's whole tensor (a stored tensor that is not the case's full shape is an integrity
failure); it also fails every case the code expects for the backend (cases(key)) that the capture
lacks or refused, every case whose stored bytes do not match their sha256, a folder holding files
its manifest does not list, and a capture of another backend than the one running (the bits class
is the code's, from the registry entry and the running backend; a manifest's record of it that
disagrees is a failure, never a looser comparison). A missing capture raises NoCapture: a failure
for a backend in COMMITTED (the capture is in git), reported with how to capture; a file whose hash does not
match the manifest raises GoldenIntegrityError naming the cases it holds (an error, never a
pass); a kernel whose source changed while its output still matches is reported as 'source
changed, output identical'.

Bits that depend on the CPU. On the interpreter a floating path's FP32 fold order is chosen by
the CPU's instruction set, not by our code: Triton's interpreter runs a floating tl.dot as numpy
float32 matmul, i.e. OpenBLAS sgemm, whose kernel (and so its summation order) OpenBLAS picks per
CPU core type (native, small_gemm); the cublas path is torch.matmul, whose bf16/fp16 kernel ATen,
oneDNN and MKL pick by the CPU (ATEN_CPU_CAPABILITY, avx512_bf16, AMX...). Measured on an AVX-512
EPYC (2026-11-30): cublas M=17 differs by 1 ulp in 1-3 of 1632 elements between AVX-512 with bf16,
ONEDNN_MAX_CPU_ISA=AVX2 and ATEN_CPU_CAPABILITY=default; small_gemm's output differs on 1 of 16
bf16 and 7 of 16 fp16 random M=16 inputs between OPENBLAS_CORETYPE=Haswell and SkylakeX. Such a
path is captured with "bits": "isa-dependent", the reason, and the ISA key of the machine (isa():
CPU flags, torch's CPU capability, numpy's BLAS core, threads...). It is compared bit for bit
where the ISA key equals the capture's, and otherwise per element within a derived bound: two
FP32 folds of the same exact products, in any orders, each lie within F of the exact sum
(F = (K + 2) 2^-24 S with S = sum_k |x_k||w_k| from the captured inputs, see fold_bound), and
each is then rounded once to the output dtype (half a spacing), so
    |y - golden| <= 2 F + spacing(max(|y|, |golden|)).
Integer paths stay exact everywhere: their INT8 dots are exact and their FP32 epilogue is a fixed
sequence of elementwise IEEE operations (identical bits under every setting above). GPU captures
are keyed by the architecture (sm90) and compared bit for bit.
"""
import ast
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import backend, checks, inputs, provenance, registry, verdicts
from . import numerics as bounds     # `numerics` here is the capture's own check, below
from . import cases as casemodel
from .bits import same_bits
# the comparisons (bit for bit, within the cross-ISA bound) are the verdict library's
from .verdicts import compare, compare_bound  # noqa: F401
from .weights import PQ2Weight

GOLDEN = provenance.ROOT / "golden"
FORMAT = 2
# format 1 (golden/sm90 of 2026-11-30): no per-case x hash, no "bits"/"isa" per path (read as
# the code's bits class, with the capture's ISA unknown)
READABLE = (1, 2)
# backends whose capture is committed to git: a missing one is a failure, not a skip
COMMITTED = ("interpreter", "sm90")
MODEL_COMMITTED = ("sm90",)        # and those whose GSM8K model capture (<key>/model/) is committed
MANIFEST = "manifest.json"
INPUTS = "inputs.safetensors"



class NoCapture(Exception):
    """No capture for this backend: a failure (a skip only with an explicit opt-out, and in
    pytest for a backend outside COMMITTED), saying how to make one."""


class GoldenIntegrityError(Exception):
    """A capture that does not match its manifest (or cannot be reproduced): an error."""


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_sha256(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return sha256_bytes(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def default_dir(key: str | None = None) -> Path:
    return GOLDEN / (key or backend.golden_key())


def _dev(key: str) -> str:
    return "cpu" if key == "interpreter" else "cuda"


def capture_hint(key: str, paths=None, d: Path | None = None, *, model: bool = False) -> str:
    """The command, runnable from the checkout, that makes the capture `d` (default: the
    backend's committed folder)."""
    only = f" --paths {','.join(paths)}" if paths else ""
    where = "" if d is None or _is_default(d, key) else f" --dir {d}"
    return f"./pq2 --device {_dev(key)} golden capture{' --model' if model else ''}{only}{where}"


def _is_default(d: Path, key: str) -> bool:
    return Path(d).resolve() in (default_dir(key).resolve(), (default_dir(key) / "model").resolve())


def repro(key: str, case_id: str, d: Path | None = None) -> str:
    """The one-line command, runnable from the checkout, that re-runs this case's verification."""
    where = "" if d is None or Path(d).resolve() == default_dir(key).resolve() else f" --dir {d}"
    return f"./pq2 --device {_dev(key)} golden verify{where} --case '{case_id}'"


def existing_captures() -> list[str]:
    """The capture folders under golden/ (case captures and model captures), for messages."""
    out = []
    for m in sorted(GOLDEN.glob("*/" + MANIFEST)) + sorted(GOLDEN.glob("*/model/" + MANIFEST)):
        out.append(m.parent.relative_to(provenance.ROOT).as_posix())
    return sorted(out)


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
                if k in ("vendor_id", "CPU implementer") and vendor == "unknown":
                    vendor = v
                elif k in ("flags", "Features"):
                    flags = set(v.split())
                    break
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


# --- kernel sources ------------------------------------------------------------------------
def _module_file(modname: str) -> Path:
    return provenance.ROOT / (modname.replace(".", "/") + ".py")


def _kernel_imports(f: Path) -> set[str]:
    """kernels/<name>.py files a module imports directly (from .x / kernels.x / from . import x)."""
    out = set()
    pkg = f.parent.name
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and pkg == "kernels":
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and node.module and node.module.startswith("kernels."):
                names = [node.module.split(".", 1)[1]]
            elif node.level == 0 and node.module == "kernels":
                names = [a.name for a in node.names]
            else:
                continue
            out |= {n for n in names if (provenance.ROOT / "kernels" / f"{n}.py").exists()}
    return out


def source_files(path: registry.Path) -> list[str]:
    """The path's module file, kernels/common.py, kernels/prepare.py, and the kernel modules it
    imports directly (relative to the repository root)."""
    f = _module_file(path.module)
    files = {f.relative_to(provenance.ROOT).as_posix(), "kernels/common.py", "kernels/prepare.py"}
    if f.exists():
        files |= {f"kernels/{n}.py" for n in _kernel_imports(f)}
    return sorted(files)


def source_hashes(path: registry.Path) -> dict:
    files = {rel: (sha256_file(provenance.ROOT / rel) if (provenance.ROOT / rel).exists() else None)
             for rel in source_files(path)}
    combined = sha256_bytes("".join(f"{k}:{v}\n" for k, v in sorted(files.items())).encode())
    return {"sha256": combined, "files": files}


# --- cases and inputs ----------------------------------------------------------------------
def cases(key: str, paths=None, kset: str | None = None) -> list[checks.Case]:
    """The golden profile of a backend (pq2verify.cases.golden_cases)."""
    return casemodel.golden_cases(key, paths, kset)


def select_paths(paths=None, kset: str | None = None) -> list[registry.Path]:
    """Registry paths by name and/or by what the kernel set holds on this backend (the one
    rule, pq2verify.kernelsets)."""
    return casemodel.select_paths(paths, kset, backend.golden_key())


def x_key(c: checks.Case) -> str:
    return f"x:{c.m}x{c.k}:{c.dtype}:{c.kind}:seed{c.seed}"


def weight_meta(c: checks.Case) -> tuple[str, dict]:
    dense = registry.get(c.path).weight == "dense"
    seed = casemodel.weight_seed(c.n, c.k)
    if dense:
        return f"wd:{c.n}x{c.k}:{c.dtype}:seed{seed}", {"kind": "dense", "n": c.n, "k": c.k, "dtype": c.dtype, "seed": seed}
    return f"w:{c.n}x{c.k}:seed{seed}", {"kind": "pq2", "n": c.n, "k": c.k, "seed": seed}


def make_weight(meta: dict) -> torch.Tensor:
    """The weight's bytes, generated on the CPU (CPU generators are reproducible across
    machines; the GPU's draws other numbers): prepared PQ2 bytes, or the dense matrix."""
    if meta["kind"] == "dense":
        return inputs.dense_weight(meta["n"], meta["k"], meta["seed"], "cpu", checks.DTYPES[meta["dtype"]])
    return inputs.ternary_weight(meta["n"], meta["k"], meta["seed"], "cpu", "prepared").data


def weight_for(c: checks.Case, data: torch.Tensor, device):
    """The case's weight on the device, in the case's layout."""
    if registry.get(c.path).weight == "dense":
        return data.to(device)
    w = PQ2Weight(data.to(device), c.n, c.k, "prepared", checked=True)
    return w.to_raw() if c.layout == "raw" else w


def make_x(c: checks.Case) -> torch.Tensor:
    return inputs.activations(c.m, c.k, c.seed, c.kind, checks.DTYPES[c.dtype], "cpu")


def run_case(c: checks.Case, x: torch.Tensor, w, device, *, kernel=None, avoid=(), keep=None) -> torch.Tensor:
    """The path's output bytes (a CPU copy the caller owns) for stored x: strided cases read x
    from a buffer twice as wide whose other half is NaN; the output is a fresh buffer pre-filled
    with NaN, which the kernel must fill and return. avoid: tensors (an earlier run's output, the
    golden) whose storage the result must not be; keep: a list that receives the kernel's buffer.
    `kernel` replaces the path's run (pq2verify.selftest runs broken variants against the
    captures)."""
    p = registry.get(c.path)
    xd = x.to(device)
    if c.strided:
        buf = torch.full((c.m, 2 * c.k), float("nan"), dtype=xd.dtype, device=device)
        buf[:, : c.k] = xd
        xd = buf[:, : c.k]
    out = torch.full((c.m, c.n), float("nan"), dtype=xd.dtype, device=device)
    y = (kernel or p.kernel())(xd, w, out=out)
    if y.data_ptr() != out.data_ptr():
        raise AssertionError(f"{p.name}.run ignored out= (it returned another buffer)")
    if tuple(y.shape) != (c.m, c.n):
        raise AssertionError(f"{p.name}.run returned {tuple(y.shape)}, the case's output is {(c.m, c.n)}")
    for t in avoid:
        if _storage(t) == _storage(y):
            raise AssertionError(f"{p.name}.run returned the storage of an earlier result: comparing the two "
                                 "would compare a tensor with itself")
    if keep is not None:
        keep.append(y)          # alive, so no later fresh buffer can take its address
    # a copy the harness owns: a kernel that later writes into a buffer it returned cannot change it
    return y.detach().to("cpu", copy=True)


def _storage(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def numerics(c: checks.Case, x: torch.Tensor, w, y: torch.Tensor) -> str | None:
    """None if y is within the path's relative-RMS tolerance of its own FP64 reference (quantized
    for an integer path, dense for a floating one; verdicts.rms), else why not: a golden of a
    wrong answer would freeze the bug."""
    f = numerics_failure(c, x, w, y)
    return None if f is None else f.message


def numerics_failure(c: checks.Case, x: torch.Tensor, w, y: torch.Tensor) -> "verdicts.Failure | None":
    from reference import projection
    p = registry.get(c.path)
    if not bool(torch.isfinite(y.float()).all()):
        return verdicts.failure(verdicts.GOLDEN_NUMERICS, "output has non-finite values", c.id)
    if p.weight == "dense":
        refs, which = {"dense": lambda: projection.dense(x, w.cpu())}, "dense"
    else:
        wc = w.to("cpu")
        which = "quantized" if p.reference == "quantized" else "dense"
        wb = dict(weight=wc.data, layout=wc.layout, n=wc.n, k=wc.k)   # the bytes: reference decodes them itself
        refs = {"quantized": lambda: projection.quantized(x, **wb), "dense": lambda: projection.floating(x, **wb)}
    (v,) = verdicts.rms(p, y.double().numpy(), lambda r: refs[r](), checks.DTYPES[c.dtype], only=(which,))
    if v.ok:
        return None
    return verdicts.failure(verdicts.GOLDEN_NUMERICS,
                            f"relative RMS vs {which} FP64 reference {v.err:.3g} > {v.tol:.3g}", c.id)


# --- capture --------------------------------------------------------------------------------
def _load_tensors(d: Path, name: str) -> dict:
    from safetensors.torch import load_file
    f = d / name
    return load_file(str(f)) if f.exists() else {}


def _save_tensors(d: Path, name: str, tensors: dict) -> str:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(d / name))
    (d / name).chmod(0o644)      # safetensors writes 0600; captures are shared files
    return sha256_file(d / name)


def _provenance(device) -> dict:
    info = provenance.collect()
    keep = {k: info[k] for k in ("date", "commit", "torch", "triton", "python") if k in info}
    keep["device"] = backend.name()
    return keep


def capture(dest: Path, todo: list[checks.Case], device, *, force=False, log=print) -> dict:
    """Run each case, check its numerics (and that a rerun gives the same bytes), and write the
    captures into dest, replacing the captured paths' earlier cases and keeping the others'."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    old = None
    if (dest / MANIFEST).exists():
        old = load(dest)                       # integrity-checked: never merge into a broken capture
    man = old.manifest if old else {"format": FORMAT, "backend_key": backend.golden_key(),
                                    "files": {}, "paths": {}, "weights": {}, "cases": []}
    names = {c.path for c in todo}
    xs = _load_tensors(dest, INPUTS) if old else {}
    if old:
        _upgrade(man, xs)                      # the kept cases of a format-1 capture, as format 2
    keep = [e for e in man["cases"] if e["path"] not in names]
    key = backend.golden_key()
    prov = _provenance(device)
    weights, ys, new, refused = {}, {}, [], []
    for i, c in enumerate(todo):
        wkey, meta = weight_meta(c)
        if wkey not in weights:
            data = make_weight(meta)
            # stored, whatever its size: torch's CPU randn/exp bits follow ATen's CPU capability
            # (dense_weight(96, 2048) differs under ATEN_CPU_CAPABILITY=default), so a weight
            # regenerated on another host may not be the captured one (format-1 captures did)
            meta = dict(meta, sha256=tensor_sha256(data), stored=True)
            weights[wkey] = (data, meta)
        data, meta = weights[wkey]
        x = make_x(c)
        w = weight_for(c, data, device)
        bufs = []
        try:
            y = run_case(c, x, w, device, keep=bufs)
            why = None if force else numerics(c, x, w, y)
            if why is None and not same_bits(run_case(c, x, w, device, avoid=bufs), y):
                why = "a rerun gave other bytes (not deterministic)"
        except Exception as ex:     # a case the code expects and the kernel cannot run: refused, so verify fails it
            why = f"raised {type(ex).__name__}: {ex}"
        if why is not None:
            refused.append((c, why))
            log(f"refused {c.id}: {why}")
            continue
        xs[x_key(c)] = x
        ys.setdefault(c.path, {})[c.id] = y
        e = {"id": c.id, **asdict(c), "x": x_key(c), "x_sha256": tensor_sha256(x), "weight": wkey,
             "file": f"{c.path}.safetensors", "y_sha256": tensor_sha256(y)}
        new.append(e)
        log(f"[{i + 1}/{len(todo)}] {c.id}")
    for wkey, (data, meta) in weights.items():
        man["weights"][wkey] = meta
        if meta["stored"]:
            xs[wkey] = data
    man["cases"] = keep + new
    for name in names:
        if name in ys:
            man["files"][f"{name}.safetensors"] = _save_tensors(dest, f"{name}.safetensors", ys[name])
            man["paths"][name] = {"source": source_hashes(registry.get(name)),
                                  **_bits_record(key, registry.get(name)), **prov}
        else:                                  # nothing captured for this path: drop its old file
            man["files"].pop(f"{name}.safetensors", None)
            man["paths"].pop(name, None)
            (dest / f"{name}.safetensors").unlink(missing_ok=True)
    used = {e["x"] for e in man["cases"]} | {e["weight"] for e in man["cases"]}
    man["weights"] = {k: v for k, v in man["weights"].items() if k in used}
    xs = {k: v for k, v in xs.items() if k in used}
    man["files"][INPUTS] = _save_tensors(dest, INPUTS, xs)
    man.update({"format": FORMAT, "backend_key": key, "backend": backend.name(), **prov})
    man["refused"] = [{"id": c.id, "why": why} for c, why in refused]
    _write_manifest(dest, man)
    return man


def _write_manifest(d: Path, man: dict) -> None:
    (Path(d) / MANIFEST).write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")


def _upgrade(man: dict, xs: dict) -> dict:
    """A format-1 manifest as format 2, no tensor touched: each case's x hash from the stored
    inputs (whose file hash load() has checked) and each path's bits class; the CPU a format-1
    capture ran on was not recorded ("isa": None), so its isa-dependent paths compare by the
    bound on every machine until recaptured."""
    for e in man["cases"]:
        if "x_sha256" not in e and e["x"] in xs:
            e["x_sha256"] = tensor_sha256(xs[e["x"]])
    for name, rec in man["paths"].items():
        if "bits" not in rec and name in registry.BY_NAME:
            cls, why = bits_class(man["backend_key"], registry.get(name))
            rec.update(bits=cls, bits_reason=why, isa=None)
    man["format"] = FORMAT
    return man


def upgrade(d: Path) -> dict:
    """Rewrite the format-1 manifest in d as format 2 (see _upgrade); the tensor files and
    their hashes stay as they are."""
    g = load(d)
    man = _upgrade(g.manifest, g.tensors(INPUTS))
    _write_manifest(d, man)
    return man


# --- load and verify --------------------------------------------------------------------------
@dataclass
class Golden:
    dir: Path
    manifest: dict

    def tensors(self, name: str) -> dict:
        return _load_tensors(self.dir, name)


class OtherBackend(GoldenIntegrityError):
    """A capture of another backend than the one running: its bits class and its expected
    cases are those of its own backend, so it is never compared here."""


def load(d: Path, kind: str | None = None) -> Golden:
    """The capture in d, its files checked against the manifest's hashes, and nothing in the
    folder that the manifest does not list. kind: 'model' or 'cases' where the caller knows which
    capture it wants (the advice for a missing one names the right command)."""
    d = Path(d)
    f = d / MANIFEST
    if not f.exists():
        raise NoCapture(_no_capture(d, kind))
    try:
        man = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise GoldenIntegrityError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(man, dict) or man.get("format") not in READABLE:
        fmt = man.get("format") if isinstance(man, dict) else None
        raise GoldenIntegrityError(f"{f}: format {fmt!r}, this pq2verify reads formats "
                                   f"{', '.join(map(str, READABLE))}")
    _check_schema(man, f)
    for name, want in sorted(man.get("files", {}).items()):
        p = d / name
        if not p.exists():
            raise GoldenIntegrityError(f"{p}: listed in the manifest but missing{_naming(d, man, name)}")
        got = sha256_file(p)
        if got != want:
            raise GoldenIntegrityError(f"{p}: sha256 {got[:16]}… does not match the manifest's {want[:16]}… "
                                       "(the file was changed after capture; recapture, never edit by hand)"
                                       + _naming(d, man, name))
    extra = unlisted(d, man)
    if extra:
        raise GoldenIntegrityError(f"{d} holds {len(extra)} file(s) its manifest does not list: {', '.join(extra)} "
                                   "(a capture holds only what its manifest vouches for; remove them, or recapture)")
    for e in man.get("cases", []):
        if e["file"] not in man["files"]:
            raise GoldenIntegrityError(f"{f}: case {e['id']} names {e['file']}, which the manifest does not list")
    return Golden(d, man)


_CASE_FIELDS = ("id", "file", "x", "weight", "y_sha256", *checks.Case.__dataclass_fields__)


def _check_schema(man: dict, f: Path) -> None:
    """The fields the code reads, each of its type: a manifest without them is damaged, said so,
    never a KeyError later."""
    model = man.get("kind") == "model"
    need = {"backend_key": str, "files": dict, "cases": list, **({"records": list} if model else
                                                                {"paths": dict, "weights": dict})}
    for k, t in need.items():
        if not isinstance(man.get(k), t):
            raise GoldenIntegrityError(f"{f}: no {k!r} ({t.__name__}) in the manifest; it is damaged: recapture")
    for i, e in enumerate(man["cases"]):
        gone = [k for k in _CASE_FIELDS if not isinstance(e, dict) or k not in e]
        if gone:
            label = e.get("id", "?") if isinstance(e, dict) else repr(e)
            raise GoldenIntegrityError(f"{f}: case {i} ({label}) lacks {', '.join(gone)}; the manifest is damaged: "
                                       "recapture")
    for i, r in enumerate(man.get("records", [])):
        gone = [k for k in ("key", "layer", "position", "path", "weight_sha256", "y_sha256")
                if not isinstance(r, dict) or k not in r]
        if gone:
            raise GoldenIntegrityError(f"{f}: record {i} lacks {', '.join(gone)}; the manifest is damaged: recapture")


def unlisted(d: Path, man: dict) -> list[str]:
    """Entries of the capture folder that its manifest does not list (a case capture may hold
    its backend's model capture in model/, which is checked on its own)."""
    listed = set(man.get("files", {})) | {MANIFEST}
    model_ok = man.get("kind") != "model"
    return sorted(p.name + ("/" if p.is_dir() else "") for p in Path(d).iterdir()
                  if p.name not in listed and not (model_ok and p.name == "model" and p.is_dir()))


def _no_capture(d: Path, kind: str | None) -> str:
    """Why d is not a capture, what exists instead, and how to make one."""
    model = kind == "model" or (kind is None and d.name == "model")
    key = d.parent.name if d.name == "model" else d.name
    known = key in (MODEL_COMMITTED if model else COMMITTED)
    here = ", ".join(existing_captures()) or "none"
    what = "model capture" if model else "capture"
    if _is_default(d, key):
        committed = (f" It is committed: restore it (git checkout -- golden/{key}{'/model' if model else ''}), or"
                     if known else "")
        return (f"no golden {what} for backend '{key}' ({d / MANIFEST} is missing).{committed} capture with: "
                f"{capture_hint(key, d=d, model=model)}")
    dev = _dev(backend.golden_key())
    how = (f"./pq2 --device {dev} golden capture --model --dir {d.parent}" if model and d.name == "model" else
           f"./pq2 --device {dev} golden capture --model --dir {d} (it writes {d / 'model'})" if model else
           f"./pq2 --device {dev} golden capture --dir {d}" if kind == "cases" else
           f"./pq2 --device {dev} golden capture --dir {d} (or with --model, for the GSM8K model's projections)")
    if not d.exists():
        return f"{d}: no such folder. Captures in this checkout: {here}. Make one there with: {how}"
    if not d.is_dir():
        return f"{d}: not a folder. Captures in this checkout: {here}"
    return (f"{d} holds no {MANIFEST}, so it is not a golden {what}. Captures in this checkout: {here}. "
            f"Make one there with: {how}")


def damaged_cases(d: Path, man: dict, name: str) -> list[str]:
    """Ids of the cases whose tensors in file `name` are missing or no longer match their
    recorded sha256: y of a path file; x, or a stored weight, of the inputs file. Every case
    reading the file where it cannot be parsed, or (format 1) records no hash of x."""
    cases = man.get("cases", [])
    readers = [e for e in cases if name in (e["file"], INPUTS)]
    try:
        t = _load_tensors(d, name)
    except Exception:          # a damaged header: safetensors' own errors vary
        return [e["id"] for e in readers]
    if name != INPUTS:
        return [e["id"] for e in readers if e["id"] not in t or tensor_sha256(t[e["id"]]) != e["y_sha256"]]
    bad_w = {k for k, m in man.get("weights", {}).items()
             if m.get("stored") and (k not in t or tensor_sha256(t[k]) != m["sha256"])}

    def x_bad(e):
        return e["x"] not in t or ("x_sha256" in e and tensor_sha256(t[e["x"]]) != e["x_sha256"])
    bad = [e["id"] for e in cases if e["weight"] in bad_w or x_bad(e)]
    if not bad and any("x_sha256" not in e for e in cases):
        return [e["id"] for e in cases]
    return bad


def _naming(d: Path, man: dict, name: str) -> str:
    ids = damaged_cases(d, man, name)
    if not ids:
        return "; no case's tensor changed (the change is outside them)"
    more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
    return (f"; {len(ids)} cases affected: {', '.join(ids[:3])}{more}"
            f"\n  reproduce: {repro(man.get('backend_key', d.name), ids[0], d)}")


@dataclass
class Outcome:
    case: checks.Case
    # "identical" | "within bound" (an isa-dependent path off its capture's ISA) | "different" |
    # "error" | "missing" (expected, not captured) | "integrity" (stored bytes off their hash)
    status: str
    detail: str = ""
    source_changed: list = field(default_factory=list)   # files whose hash differs from capture
    comparison: str = "exact"   # or "bound (<why the ISA key differs>)"

    @property
    def ok(self) -> bool:
        return self.status in ("identical", "within bound")

    @property
    def check(self) -> str:
        """The verdict library's name of the comparison made (verdicts.GOLDEN_BYTES: bit for bit,
        GOLDEN_BOUND: within the cross-ISA bound)."""
        return verdicts.GOLDEN_BYTES if self.comparison.startswith("exact") else verdicts.GOLDEN_BOUND

    def message(self) -> str:
        s = f"{self.case.id}: {self.status}"
        if self.comparison != "exact":
            s += f" [{self.comparison}]"
        if self.detail:
            s += f" ({self.detail})"
        if self.source_changed:
            s += ("; source changed, output identical: " if self.ok else "; source changed: ") + ", ".join(self.source_changed)
        return s


def changed_sources(g: Golden, path: str) -> list[str]:
    rec = g.manifest["paths"].get(path, {}).get("source", {}).get("files", {})
    now = source_hashes(registry.get(path))["files"]
    return sorted(f for f in set(rec) | set(now) if rec.get(f) != now.get(f))


def case_of(e: dict) -> checks.Case:
    fields = checks.Case.__dataclass_fields__
    return checks.Case(**{k: e[k] for k in fields})


def selected(g: Golden, paths=None, ids=None) -> list[dict]:
    es = g.manifest["cases"]
    if paths:
        es = [e for e in es if e["path"] in paths]
    if ids:
        es = [e for e in es if e["id"] in ids]
    return es


class _Inputs:
    """Stored tensors and regenerated weights of one capture, loaded once."""

    def __init__(self, g: Golden):
        check_backend(g)
        self.g, self.stored, self.ys, self.w = g, g.tensors(INPUTS), {}, {}
        self.isa = isa()            # this machine's key, for the isa-dependent paths

    def x(self, e: dict) -> torch.Tensor:
        t = self.stored.get(e["x"])
        if t is None:
            raise GoldenIntegrityError(f"{INPUTS} has no activations {e['x']} for case {e['id']}")
        if "x_sha256" in e and tensor_sha256(t) != e["x_sha256"]:
            raise GoldenIntegrityError(f"{INPUTS}: activations {e['x']} of {e['id']} do not match their "
                                       "recorded sha256")
        _whole(t, (e["m"], e["k"]), e["dtype"], f"{INPUTS}: activations {e['x']} of {e['id']}")
        return t

    def weight(self, key: str) -> torch.Tensor:
        if key not in self.w:
            meta = self.g.manifest["weights"][key]
            data = self.stored[key] if meta.get("stored") else make_weight(meta)
            got = tensor_sha256(data)
            if got != meta["sha256"]:
                how = "stored" if meta.get("stored") else f"regenerated from seed {meta['seed']}"
                raise GoldenIntegrityError(
                    f"weight {key} {how} has sha256 {got[:16]}…, the capture recorded {meta['sha256'][:16]}… "
                    "(the generator, the file, or this host's torch CPU capability differs: recapture)")
            self.w[key] = data
        return self.w[key]

    def y(self, e: dict) -> torch.Tensor:
        if e["file"] not in self.ys:
            self.ys[e["file"]] = self.g.tensors(e["file"])
        t = self.ys[e["file"]].get(e["id"])
        if t is None:
            raise GoldenIntegrityError(f"{e['file']} has no output for case {e['id']}")
        if tensor_sha256(t) != e["y_sha256"]:
            raise GoldenIntegrityError(f"{e['file']}: output of {e['id']} does not match its recorded sha256")
        _whole(t, (e["m"], e["n"]), e["dtype"], f"{e['file']}: output of {e['id']}")
        return t


def _whole(t: torch.Tensor, shape: tuple, dtype: str, what: str) -> None:
    """A stored tensor must be the case's whole tensor: a part of it (rows or a prefix), even one
    its hashes vouch for, would let a comparison cover only that part."""
    want = checks.DTYPES[dtype]
    if tuple(t.shape) != tuple(shape) or t.dtype != want:
        raise GoldenIntegrityError(f"{what} is {tuple(t.shape)} {t.dtype}, the case's whole tensor is "
                                   f"{tuple(shape)} {want}: the capture does not hold all of it")


def check_backend(g: Golden) -> None:
    """Refuse a capture of another backend: the code decides a case's bits class and the cases
    it expects from the backend that runs, never from the manifest's word for it."""
    here, there = backend.golden_key(), g.manifest.get("backend_key")
    if there != here:
        raise OtherBackend(f"{g.dir} holds the capture of backend {there!r}; this run is on {here!r} "
                           f"(--device {_dev(here)}). Verify it on its own backend, or use this backend's: "
                           f"golden/{here}")


class SourceChangedOutputIdentical(UserWarning):
    """A kernel's source changed since capture and its output bytes did not: worth knowing
    (a refactor that kept every bit), never a failure."""


def fold_bound(p: registry.Path, c: checks.Case, x: torch.Tensor, w, y: torch.Tensor,
               want: torch.Tensor) -> np.ndarray:
    """float64 [M, N]: how far two FP32 folds of this case on the CPU, in any orders, each
    rounded once to the output dtype, can lie apart: numerics.cross_isa_bound (2 F +
    spacing(max(|y|, |want|)), numerics.CROSS_ISA_REASON)."""
    return bounds.cross_isa_bound(p, c.k, x, w, y, want)


def comparison(g: Golden, p: registry.Path, now: dict) -> str:
    """'exact' for an exact path, and for an isa-dependent one captured on this ISA key; else
    'bound (what differs)'. The class comes from the registry entry and the running backend;
    the manifest only says on which CPU an isa-dependent path was captured."""
    if bits_class(backend.golden_key(), p)[0] == "exact":
        return "exact"
    why = isa_difference(g.manifest["paths"].get(p.name, {}).get("isa"), now)
    return "exact (ISA as captured)" if not why else f"bound ({why})"


def verify_entry(g: Golden, ins: "_Inputs", e: dict, device, *, kernel=None) -> Outcome:
    """Recompute one captured case (with `kernel` in place of the path's run, if given). Stored
    bytes that do not match their hash make the case an 'integrity' failure (never a pass)."""
    c = case_of(e)
    if c.path not in registry.BY_NAME:
        return Outcome(c, "error", f"path {c.path} is no longer in the registry")
    p = registry.get(c.path)
    changed = changed_sources(g, c.path)
    try:
        want, x, data = ins.y(e), ins.x(e), ins.weight(e["weight"])
    except GoldenIntegrityError as ex:
        return Outcome(c, "integrity", str(ex), changed)
    w = weight_for(c, data, device)
    how = comparison(g, p, ins.isa)
    try:
        # two runs, each into a fresh buffer, neither the storage of the other nor of the golden
        bufs = []
        y = run_case(c, x, w, device, kernel=kernel, avoid=(want,), keep=bufs)
        y2 = run_case(c, x, w, device, kernel=kernel, avoid=(want, *bufs), keep=bufs)
    except Exception as ex:     # a crash is that case's failure, not the whole verification
        return Outcome(c, "error", f"raised {type(ex).__name__}: {ex}", changed, how)
    if how.startswith("bound"):
        status, detail = compare_bound(y, want, fold_bound(p, c, x, w, y, want))
    else:
        status, detail = compare(y, want)
    if not same_bits(y, y2):
        rerun = ("a rerun gave other bytes (not deterministic): "
                 + compare(y2, y)[1].replace("vs captured", "vs the first run"))
        status, detail = "different", (f"{detail}; {rerun}" if detail and status == "different" else rerun)
    conflict = bits_conflict(g, p)
    if conflict:
        status, detail = ("integrity", conflict) if status in ("identical", "within bound") else \
            (status, f"{detail}; {conflict}")
    return Outcome(c, status, detail, changed, how)


def bits_conflict(g: Golden, p: registry.Path) -> str:
    """'' if the manifest's bits record of the path is the code's class, else what disagrees: a
    capture made under another class is stale (the code compares by its own class either way)."""
    rec = g.manifest.get("paths", {}).get(p.name, {})
    if "bits" not in rec:          # format 1: no record (read as the code's class)
        return ""
    cls = bits_class(backend.golden_key(), p)[0]
    if rec["bits"] == cls:
        return ""
    return (f"the manifest records bits {rec['bits']!r} for {p.name}, the code decides {cls!r} (compared as "
            f"{cls}); the capture predates the path's class: recapture it")


def missing(g: Golden, paths=None, ids=None) -> list[Outcome]:
    """A 'missing' outcome for every case the code expects on the capture's backend (cases(key))
    that the capture does not hold: a manifest with cases dropped never passes. The expected
    set is the running backend's (a capture of another one is refused)."""
    check_backend(g)
    key = backend.golden_key()
    have = {e["id"] for e in g.manifest["cases"]}
    refused = {r["id"]: r["why"] for r in g.manifest.get("refused", [])}
    out = []
    for c in cases(key, paths):
        if c.id in have or (ids and c.id not in ids):
            continue
        why = f"refused at capture ({refused[c.id]})" if c.id in refused else "not in the capture"
        out.append(Outcome(c, "missing", f"expected on backend {key} but {why}; capture it: "
                                         f"{capture_hint(key, [c.path], g.dir)}"))
    return out


def verify(g: Golden, device, *, paths=None, ids=None, log=None, kernel=None) -> list[Outcome]:
    """Recompute every selected case and compare it (bits_class says how), then add a 'missing'
    outcome for each expected case the capture lacks. A damaged file raised already in load().
    kernel: replaces the run of every selected path (one path at a time, for the selftest)."""
    ins = _Inputs(g)
    out = []
    for e in selected(g, paths, ids):
        out.append(verify_entry(g, ins, e, device, kernel=kernel))
        if log:
            log(out[-1])
    for o in missing(g, paths, ids):
        out.append(o)
        if log:
            log(o)
    return out
