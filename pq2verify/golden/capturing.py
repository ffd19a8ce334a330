"""Capture: a backend's golden cases, their inputs generated on the CPU, each run checked
(its numerics by the verdict library, a rerun's bytes) before its bytes are frozen."""

from dataclasses import asdict
from pathlib import Path

import torch

from kernels import backend
from .. import casedata, checks, provenance, registry, verdicts
from .. import cases as casemodel
from ..bits import same_bits
from .isakey import bits_class, _bits_record
from .sources import source_hashes
from .store import FORMAT, INPUTS, load, _load_tensors, MANIFEST, _save_tensors, tensor_sha256, _write_manifest


# --- cases and inputs ----------------------------------------------------------------------
def cases(key: str, paths=None, kset: str | None = None) -> list[checks.Case]:
    """The golden profile of a backend (pq2verify.cases.golden_cases)."""
    return casemodel.golden_cases(key, paths, kset)


def select_paths(paths=None, kset: str | None = None) -> list[registry.Path]:
    """Registry paths by name and/or by what the kernel set holds on this backend (the one
    rule, kernels.sets)."""
    return casemodel.select_paths(paths, kset, backend.golden_key())


def x_key(c: checks.Case) -> str:
    return f"x:{c.m}x{c.k}:{c.dtype}:{c.kind}:seed{c.seed}"


# The case's data has one builder, shared with the check: pq2verify.casedata.
def weight_meta(c) -> tuple[str, dict]:
    return casedata.weight_meta(casedata.resolve(c))


make_weight = casedata.make_weight


def weight_for(c, data: torch.Tensor, device):
    """The case's weight on the device, in the case's layout."""
    return casedata.weight_for(casedata.resolve(c), data, device)


def make_x(c) -> torch.Tensor:
    return casedata.golden_x(c.case if isinstance(c, casedata.Resolved) else c)


def run_case(c: checks.Case, x: torch.Tensor, w, device, *, kernel=None, avoid=(), keep=None) -> torch.Tensor:
    """The path's output bytes (a CPU copy the caller owns) for stored x: strided cases read x
    from a buffer twice as wide whose other half is NaN; the output is a fresh buffer pre-filled
    with NaN, which the kernel must fill and return. avoid: tensors (an earlier run's output, the
    golden) whose storage the result must not be; keep: a list that receives the kernel's buffer.
    `kernel` replaces the path's run (pq2verify.selftest runs broken variants against the
    captures)."""
    rc = casedata.resolve(c)
    c, p = rc.case, rc.path
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


def numerics_failure(c, x: torch.Tensor, w, y: torch.Tensor) -> "verdicts.Failure | None":
    data = casedata.CaseData.given(c, x, w)     # the references on all rows, from the bytes
    c, p = data.case, data.rc.path
    if not bool(torch.isfinite(y.float()).all()):
        return verdicts.failure(verdicts.GOLDEN_NUMERICS, "output has non-finite values", c.id)
    which = "dense" if p.weight == "dense" or p.reference != "quantized" else "quantized"
    (v,) = verdicts.rms(p, y.double().numpy(), data.reference, checks.DTYPES[c.dtype], only=(which,))
    if v.ok:
        return None
    return verdicts.failure(verdicts.GOLDEN_NUMERICS,
                            f"relative RMS vs {which} FP64 reference {v.err:.3g} > {v.tol:.3g}", c.id)


def _provenance(device) -> dict:
    info = provenance.collect()
    keep = {k: info[k] for k in ("date", "commit", "torch", "triton", "python") if k in info}
    keep["device"] = backend.name()
    return keep


def _merged(old: list, names: set, new: list) -> list:
    """The manifest's case list: a recaptured path's new cases where its old ones stood, the
    other paths' cases kept in place, paths new to the capture appended in capture order; so
    recapturing a path with the same bits writes the same list."""
    by_path, out, placed = {}, [], set()
    for e in new:
        by_path.setdefault(e["path"], []).append(e)
    for e in old:
        if e["path"] not in names:
            out.append(e)
        elif e["path"] not in placed:
            placed.add(e["path"])
            out.extend(by_path.get(e["path"], []))
    return out + [e for e in new if e["path"] not in placed]


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
    key = backend.golden_key()
    prov = _provenance(device)
    weights, ys, new, refused = {}, {}, [], []
    entries = {}
    for i, c in enumerate(todo):
        rc = casedata.resolve(c)               # the one lookup of the case's path
        entries.setdefault(c.path, rc.path)
        wkey, meta = weight_meta(rc)
        if wkey not in weights:
            data = make_weight(meta)
            # stored, whatever its size: torch's CPU randn/exp bits follow ATen's CPU capability
            # (dense_weight(96, 2048) differs under ATEN_CPU_CAPABILITY=default), so a weight
            # regenerated on another host may not be the captured one (format-1 captures did)
            meta = dict(meta, sha256=tensor_sha256(data), stored=True)
            weights[wkey] = (data, meta)
        data, meta = weights[wkey]
        x = make_x(rc)
        w = weight_for(rc, data, device)
        bufs = []
        try:
            y = run_case(rc, x, w, device, keep=bufs)
            why = None if force else numerics(rc, x, w, y)
            if why is None and not same_bits(run_case(rc, x, w, device, avoid=bufs), y):
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
    man["cases"] = _merged(man["cases"], names, new)
    for name in names:
        if name in ys:
            man["files"][f"{name}.safetensors"] = _save_tensors(dest, f"{name}.safetensors", ys[name])
            man["paths"][name] = {"source": source_hashes(entries[name]),
                                  **_bits_record(key, entries[name]), **prov}
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
