"""Golden captures: frozen output bytes of every path on a fixed set of cases, per backend
(golden/interpreter/, golden/sm90/: GPU and interpreter rounding differ).

A capture directory holds
- inputs.safetensors: the activations of every case (and weights small enough to store),
- <path>.safetensors: that path's output of every case, keyed by case id,
- manifest.json: per-file sha256, the cases, each weight as seed + shape + sha256 (large ones
  are regenerated on the CPU and their hash verified), per path the sha256 of its kernel
  sources, torch and triton versions, GPU name or 'interpreter', commit and date.

`verify` recomputes every case and requires identical bytes. A missing capture raises
NoCapture (a skip: the message says how to capture); a file whose hash does not match the
manifest raises GoldenIntegrityError (an error, never a pass); a kernel whose source changed
while its output still matches is reported as 'source changed, output identical'.
"""
import ast
import hashlib
import importlib
import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import backend, checks, inputs, provenance, registry
from .graphs import bits, same_bits
from .weights import PQ2Weight

GOLDEN = provenance.ROOT / "golden"
FORMAT = 1
MANIFEST = "manifest.json"
INPUTS = "inputs.safetensors"
STORE_WEIGHT_MAX = 64 * 1024      # bytes: smaller weights are stored, larger ones regenerated

# Cases. Interpreter: small shapes, one with split-K geometry; GPU: modest shapes (N, K <= 2048).
SHAPES = {
    "interpreter": {"pq2": [("ga", 64, 256, "all"), ("gb", 40, 1024, "one")], "dense": [("gd", 96, 256, "all")]},
    "gpu": {"pq2": [("ga", 2048, 2048, "all"), ("gb", 1536, 1024, "one")], "dense": [("gd", 96, 2048, "all")]},
}
MS = {"interpreter": (1, 2, 17), "gpu": (1, 4, 17, 64)}
KINDS = inputs.ACTIVATION_KINDS


class NoCapture(Exception):
    """No capture for this backend: a reason to skip, saying how to make one."""


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


def capture_hint(key: str) -> str:
    dev = "cpu" if key == "interpreter" else "cuda"
    return f"pq2verify --device {dev} golden capture   (writes golden/{key}/; commit it)"


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
    """The fixed case set of a backend ('interpreter' or any GPU key)."""
    kind_set = "interpreter" if key == "interpreter" else "gpu"
    sel = select_paths(paths, kset)
    out = []
    for p in sel:
        for shape, n, k, span in SHAPES[kind_set][p.weight]:
            for i, m in enumerate(MS[kind_set]):
                if not p.serves(m):
                    continue
                for j, dt in enumerate(checks.DTYPES):
                    if checks.DTYPES[dt] not in p.dtypes or (span == "one" and j):
                        continue
                    for lay in p.layouts:
                        if span == "one" and lay == "raw":
                            continue
                        # kinds and strides depend on (M, dtype) only, so paths share inputs
                        c = checks.Case(p.name, shape, n, k, m, dt, lay, KINDS[(i + 2 * j) % len(KINDS)],
                                        strided=m > 1 and i % 2 == 1)
                        out.append(checks._seeded(c))
    return out


def select_paths(paths=None, kset: str | None = None) -> list[registry.Path]:
    """Registry paths by name and/or by the kernel set that can serve them: legacy -> the
    legacy paths; tuned -> all (tuned falls back on legacy); exact -> legacy plus the tuned
    paths proven bit-identical on this backend."""
    sel = list(registry.PATHS) if not paths else [registry.get(p) for p in paths]
    if kset is None:
        return sel
    if kset not in registry.KERNEL_SETS:
        raise ValueError(f"--kernels: {kset!r} is not a kernel set; expected one of {', '.join(registry.KERNEL_SETS)}")
    if kset == "legacy":
        return [p for p in sel if p.kset == "legacy"]
    if kset == "exact":
        from .dispatch import verified_exact
        ok = verified_exact(backend.golden_key())
        return [p for p in sel if p.kset == "legacy" or p.name in ok]
    return sel


def x_key(c: checks.Case) -> str:
    return f"x:{c.m}x{c.k}:{c.dtype}:{c.kind}:seed{c.seed}"


def weight_meta(c: checks.Case) -> tuple[str, dict]:
    dense = registry.get(c.path).weight == "dense"
    seed = zlib.crc32(f"w{c.n}x{c.k}".encode()) % 100_000
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


def run_case(c: checks.Case, x: torch.Tensor, w, device) -> torch.Tensor:
    """The path's output bytes (on the CPU) for stored x: strided cases read x from a buffer
    twice as wide whose other half is NaN; the output is pre-filled with NaN."""
    p = registry.get(c.path)
    xd = x.to(device)
    if c.strided:
        buf = torch.full((c.m, 2 * c.k), float("nan"), dtype=xd.dtype, device=device)
        buf[:, : c.k] = xd
        xd = buf[:, : c.k]
    out = torch.full((c.m, c.n), float("nan"), dtype=xd.dtype, device=device)
    y = p.kernel()(xd, w, out=out)
    if y.data_ptr() != out.data_ptr():
        raise AssertionError(f"{p.name}.run ignored out=")
    return y.cpu()


def numerics(c: checks.Case, x: torch.Tensor, w, y: torch.Tensor) -> str | None:
    """None if y is within the path's tolerance of its FP64 reference, else why not: a golden
    of a wrong answer would freeze the bug."""
    from reference import metrics, projection
    p = registry.get(c.path)
    if not bool(torch.isfinite(y.float()).all()):
        return "output has non-finite values"
    if p.weight == "dense":
        ref, which = projection.dense(x, w.cpu()), "dense"
    else:
        wc = w.to("cpu")
        which = "quantized" if p.reference == "quantized" else "dense"
        ref = projection.quantized(x, wc) if which == "quantized" else projection.floating(x, wc)
    err = metrics.relative_rms(y.double().numpy(), ref)
    tol = p.tolerance(checks.DTYPES[c.dtype], which)
    return None if err <= tol else f"relative RMS vs {which} FP64 reference {err:.3g} > {tol:.3g}"


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
    keep = [e for e in man["cases"] if e["path"] not in names]
    xs = _load_tensors(dest, INPUTS) if old else {}
    prov = _provenance(device)
    weights, ys, new, refused = {}, {}, [], []
    for i, c in enumerate(todo):
        wkey, meta = weight_meta(c)
        if wkey not in weights:
            data = make_weight(meta)
            meta = dict(meta, sha256=tensor_sha256(data), stored=data.numel() * data.element_size() <= STORE_WEIGHT_MAX)
            weights[wkey] = (data, meta)
        data, meta = weights[wkey]
        x = make_x(c)
        w = weight_for(c, data, device)
        y = run_case(c, x, w, device)
        why = None if force else numerics(c, x, w, y)
        if why is None and not same_bits(run_case(c, x, w, device), y):
            why = "a rerun gave other bytes (not deterministic)"
        if why is not None:
            refused.append((c, why))
            log(f"refused {c.id}: {why}")
            continue
        xs[x_key(c)] = x
        ys.setdefault(c.path, {})[c.id] = y
        e = {"id": c.id, **asdict(c), "x": x_key(c), "weight": wkey, "file": f"{c.path}.safetensors",
             "y_sha256": tensor_sha256(y)}
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
            man["paths"][name] = {"source": source_hashes(registry.get(name)), **prov}
        else:                                  # nothing captured for this path: drop its old file
            man["files"].pop(f"{name}.safetensors", None)
            man["paths"].pop(name, None)
            (dest / f"{name}.safetensors").unlink(missing_ok=True)
    used = {e["x"] for e in man["cases"]} | {e["weight"] for e in man["cases"]}
    man["weights"] = {k: v for k, v in man["weights"].items() if k in used}
    xs = {k: v for k, v in xs.items() if k in used}
    man["files"][INPUTS] = _save_tensors(dest, INPUTS, xs)
    man.update({"format": FORMAT, "backend_key": backend.golden_key(), "backend": backend.name(), **prov})
    man["refused"] = [{"id": c.id, "why": why} for c, why in refused]
    (dest / MANIFEST).write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    return man


# --- load and verify --------------------------------------------------------------------------
@dataclass
class Golden:
    dir: Path
    manifest: dict

    def tensors(self, name: str) -> dict:
        return _load_tensors(self.dir, name)


def load(d: Path) -> Golden:
    """The capture in d, its files checked against the manifest's hashes."""
    d = Path(d)
    f = d / MANIFEST
    if not f.exists():
        key = d.name
        raise NoCapture(f"no golden capture for backend '{key}' ({f} is missing); capture with: {capture_hint(key)}")
    try:
        man = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise GoldenIntegrityError(f"{f}: not valid JSON ({e})") from None
    if man.get("format") != FORMAT:
        raise GoldenIntegrityError(f"{f}: format {man.get('format')!r}, this pq2verify reads format {FORMAT}")
    for name, want in sorted(man.get("files", {}).items()):
        p = d / name
        if not p.exists():
            raise GoldenIntegrityError(f"{p}: listed in the manifest but missing")
        got = sha256_file(p)
        if got != want:
            raise GoldenIntegrityError(f"{p}: sha256 {got[:16]}… does not match the manifest's {want[:16]}… "
                                       "(the file was changed after capture; recapture, never edit by hand)")
    for e in man.get("cases", []):
        if e["file"] not in man["files"]:
            raise GoldenIntegrityError(f"{f}: case {e['id']} names {e['file']}, which the manifest does not list")
    return Golden(d, man)


@dataclass
class Outcome:
    case: checks.Case
    status: str                 # "identical" | "different" | "error"
    detail: str = ""
    source_changed: list = field(default_factory=list)   # files whose hash differs from capture

    @property
    def ok(self) -> bool:
        return self.status == "identical"

    def message(self) -> str:
        s = f"{self.case.id}: {self.status}"
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
        self.g, self.stored, self.ys, self.w = g, g.tensors(INPUTS), {}, {}

    def weight(self, key: str) -> torch.Tensor:
        if key not in self.w:
            meta = self.g.manifest["weights"][key]
            data = self.stored[key] if meta.get("stored") else make_weight(meta)
            got = tensor_sha256(data)
            if got != meta["sha256"]:
                how = "stored" if meta.get("stored") else f"regenerated from seed {meta['seed']}"
                raise GoldenIntegrityError(
                    f"weight {key} {how} has sha256 {got[:16]}…, the capture recorded {meta['sha256'][:16]}… "
                    "(the generator or the file changed: recapture)")
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
        return t


def compare(y: torch.Tensor, want: torch.Tensor) -> tuple[str, str]:
    if same_bits(y, want):
        return "identical", ""
    if y.shape != want.shape or y.dtype != want.dtype:
        return "different", f"shape/dtype {tuple(y.shape)} {y.dtype} vs captured {tuple(want.shape)} {want.dtype}"
    diff = bits(y) != bits(want)
    m, n = (int(v) for v in torch.nonzero(diff)[0])
    ulps = (bits(y).int() - bits(want).int()).abs().max().item()
    return "different", (f"{int(diff.sum())} of {y.numel()} elements differ, first at [{m}, {n}]: "
                         f"{y[m, n].item()} vs captured {want[m, n].item()}; max {ulps} ulp")


class SourceChangedOutputIdentical(UserWarning):
    """A kernel's source changed since capture and its output bytes did not: worth knowing
    (a refactor that kept every bit), never a failure."""


def verify_entry(g: Golden, ins: "_Inputs", e: dict, device) -> Outcome:
    """Recompute one captured case. GoldenIntegrityError propagates (never a pass)."""
    c = case_of(e)
    if c.path not in registry.BY_NAME:
        return Outcome(c, "error", f"path {c.path} is no longer in the registry")
    changed = changed_sources(g, c.path)
    want = ins.y(e)
    x = ins.stored.get(e["x"])
    if x is None:
        raise GoldenIntegrityError(f"{INPUTS} has no activations {e['x']} for case {e['id']}")
    w = weight_for(c, ins.weight(e["weight"]), device)
    try:
        y = run_case(c, x, w, device)
    except Exception as ex:     # a crash is that case's failure, not the whole verification
        return Outcome(c, "error", f"raised {type(ex).__name__}: {ex}", changed)
    status, detail = compare(y, want)
    return Outcome(c, status, detail, changed)


def verify(g: Golden, device, *, paths=None, ids=None, log=None) -> list[Outcome]:
    """Recompute every selected case and compare bytes. GoldenIntegrityError propagates."""
    ins = _Inputs(g)
    out = []
    for e in selected(g, paths, ids):
        out.append(verify_entry(g, ins, e, device))
        if log:
            log(out[-1])
    return out
