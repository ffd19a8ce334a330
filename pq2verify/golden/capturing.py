"""Capture: a backend's golden cases, their inputs generated on the CPU, each run checked
(its numerics by the verdict library, a rerun's bytes) before its bytes are frozen."""

from dataclasses import asdict
from pathlib import Path

import torch

from .. import backend, checks, inputs, provenance, registry, verdicts
from .. import cases as casemodel
from ..bits import same_bits
from ..weights import PQ2Weight
from .isakey import bits_class, _bits_record
from .sources import source_hashes
from .store import FORMAT, INPUTS, load, _load_tensors, MANIFEST, _save_tensors, tensor_sha256, _write_manifest


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
