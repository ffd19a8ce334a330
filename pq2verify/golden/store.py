"""Golden capture folders: where they live, their manifest and files checked against their
hashes (load), the exceptions a damaged or missing capture raises, and the commands that make or
re-verify one. See pq2verify.golden for the format."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import backend
from .. import checks, provenance


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


def _load_tensors(d: Path, name: str) -> dict:
    from safetensors.torch import load_file
    f = d / name
    return load_file(str(f)) if f.exists() else {}


def _save_tensors(d: Path, name: str, tensors: dict) -> str:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(d / name))
    (d / name).chmod(0o644)      # safetensors writes 0600; captures are shared files
    return sha256_file(d / name)


def _write_manifest(d: Path, man: dict) -> None:
    (Path(d) / MANIFEST).write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")


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
