"""Verify: every captured case recomputed twice and compared with its capture, bit for bit or
within the cross-ISA bound (isakey.bits_class says which), plus every expected case it lacks."""

from dataclasses import dataclass, field

import numpy as np
import torch

from kernels import backend
from .. import casedata, checks, registry, verdicts
from ..bits import same_bits
from ..verdicts import compare, compare_bound
from . import capturing, isakey
from .capturing import cases, run_case, weight_for
from .isakey import bits_class, isa_difference
from .sources import source_hashes
from .store import capture_hint, _dev, Golden, GoldenIntegrityError, INPUTS, OtherBackend, tensor_sha256


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


def changed_sources(g: Golden, path: "str | registry.Path") -> list[str]:
    p = registry.get(path) if isinstance(path, str) else path
    rec = g.manifest["paths"].get(p.name, {}).get("source", {}).get("files", {})
    now = source_hashes(p)["files"]
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
        self.isa = isakey.isa()            # this machine's key, for the isa-dependent paths

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
            data = self.stored[key] if meta.get("stored") else capturing.make_weight(meta)
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
    c = c.case if isinstance(c, casedata.Resolved) else c
    return casedata.CaseData.given(casedata.Resolved(c, p), x, w).cross_isa_bound(y, want)


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
    rc = casedata.resolve(c)                   # the one lookup of the case's path
    p = rc.path
    changed = changed_sources(g, p)
    try:
        want, x, data = ins.y(e), ins.x(e), ins.weight(e["weight"])
    except GoldenIntegrityError as ex:
        return Outcome(c, "integrity", str(ex), changed)
    w = weight_for(rc, data, device)
    how = comparison(g, p, ins.isa)
    try:
        # two runs, each into a fresh buffer, neither the storage of the other nor of the golden
        bufs = []
        y = run_case(rc, x, w, device, kernel=kernel, avoid=(want,), keep=bufs)
        y2 = run_case(rc, x, w, device, kernel=kernel, avoid=(want, *bufs), keep=bufs)
    except Exception as ex:     # a crash is that case's failure, not the whole verification
        return Outcome(c, "error", f"raised {type(ex).__name__}: {ex}", changed, how)
    if how.startswith("bound"):
        status, detail = compare_bound(y, want, fold_bound(p, rc, x, w, y, want))
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
