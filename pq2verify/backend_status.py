"""What a backend lacks of its own records, and the first steps that make them.

Each backend key (backend.golden_key: 'sm90', 'interpreter', 'sm86', ...) has files of its own,
committed: its exactness record (pq2verify/verified/exact-<key>.json, which the exact set
reads), its golden capture (golden/<key>/) and, on a GPU, its model capture
(golden/<key>/model/). Without a record that holds a proof the exact set is the legacy set;
without the captures golden verify has nothing to verify. Nothing about that is an error
until someone relies on it, so it is said: cli.main prints `warning()` on stderr before every
command, and every report carries `status()` (provenance.collect's "backend_status"; `line()`
for Markdown and HTML). docs/NEW_BACKEND.md has the steps.
"""
import json
from pathlib import Path

DOC = "docs/NEW_BACKEND.md"
_ROOT = Path(__file__).resolve().parent.parent


def _rel(p: Path) -> str:
    try:
        return Path(p).resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        return str(p)


def _dev(key: str) -> str:
    return "cpu" if key == "interpreter" else "cuda"


def model_expected(key: str) -> bool:
    """A model capture is made on a GPU (the interpreter cannot run the model in useful time;
    golden.MODEL_COMMITTED holds GPU keys only)."""
    return key != "interpreter"


def _proofs(key: str) -> tuple[dict | None, str | None]:
    """(what the record holds, why it cannot be read): held / refuted (from the current sources)
    / not current (unproven, stale, an older format) / not derived (a tuned path without an
    entry). (None, None) without a record file."""
    from kernels import sets as kernelsets
    from . import registry
    if not kernelsets.verified_file(key).is_file():
        return None, None
    try:
        rec = kernelsets.record(key)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"cannot be read ({type(e).__name__}: {e})"
    entries = rec.get("paths") if isinstance(rec, dict) else None
    if not isinstance(entries, dict):
        return None, "holds no 'paths' object"
    held = kernelsets.verified_exact(key)
    out = {"held": [], "refuted": [], "not_current": [], "not_derived": []}
    for p in registry.paths(kset="tuned"):
        if p.counterpart is None:
            continue
        e = entries.get(p.name)
        if p.name in held:
            out["held"].append(p.name)
        elif not isinstance(e, dict):
            out["not_derived"].append(p.name)
        elif (e.get("rule") == "refuted" and e.get("format") == kernelsets.FORMAT
              and e.get("sources") == kernelsets.sources_digest(p.name, p.counterpart)):
            out["refuted"].append(p.name)
        else:
            out["not_current"].append(p.name)
    return out, None


def status(key: str | None = None) -> dict:
    """What backend `key` (default: this process's, backend.golden_key) lacks, as a JSON-able
    record: missing (each with item, path and detail; empty when nothing is), whether the exact
    set equals legacy here, the proofs the record holds, and the steps that make what is
    missing (in order, then commit the files)."""
    from kernels import backend, sets as kernelsets
    from . import golden
    key = key or backend.golden_key()
    key = "interpreter" if key == "emulate" else key
    rec_path = _rel(kernelsets.verified_file(key))
    proofs, broken = _proofs(key)
    missing = []
    if proofs is None:
        what = f"{rec_path} {broken}" if broken else f"no exactness record ({rec_path})"
        missing.append({"item": "exactness record", "path": rec_path,
                        "detail": f"{what}: the exact set equals legacy on {key}"})
    elif not proofs["held"] and (proofs["not_current"] or proofs["not_derived"]):
        why = "; ".join(f"{label}: {', '.join(proofs[k])}" for k, label in
                        (("not_current", "not proven from the current kernel sources"),
                         ("not_derived", "not derived"), ("refuted", "refuted")) if proofs[k])
        missing.append({"item": "exactness proofs", "path": rec_path,
                        "detail": f"{rec_path} holds nothing proven (an entry counts only with rule 'proven' "
                                  f"derived from the current kernel sources; {why}): the exact set equals legacy "
                                  f"on {key}"})
    elif proofs["not_current"] or proofs["not_derived"]:
        gone = proofs["not_current"] + proofs["not_derived"]
        missing.append({"item": "current proofs", "path": rec_path,
                        "detail": f"{rec_path} holds no current proof for {', '.join(gone)} (exact serves their "
                                  f"calls by their counterparts); proven: {', '.join(proofs['held'])}"})
    cap = golden.default_dir(key)
    if not (cap / golden.MANIFEST).is_file():
        missing.append({"item": "golden capture", "path": _rel(cap),
                        "detail": f"no golden capture ({_rel(cap)}): golden verify has nothing to verify on {key}"})
    if model_expected(key) and not (cap / "model" / golden.MANIFEST).is_file():
        missing.append({"item": "model capture", "path": _rel(cap / "model"),
                        "detail": f"no model capture ({_rel(cap / 'model')}): golden verify --model has nothing "
                                  f"to verify on {key}, and replay reads another backend's activations"})
    return {"key": key, "missing": missing,
            "exact_equals_legacy": proofs is None or not proofs["held"],
            "exact_proven": sorted(proofs["held"]) if proofs else [],
            "steps": steps(key, [m["item"] for m in missing]), "doc": DOC}


def steps(key: str, items) -> list[str]:
    """The commands, runnable from the checkout, that make the missing items, then the commit."""
    dev, out, files = _dev(key), [], []
    if {"exactness record", "exactness proofs", "current proofs"} & set(items):
        out.append(f"./pq2 --device {dev} check --derive-exact --record")
        files.append(f"pq2verify/verified/exact-{key}.json")
    if "golden capture" in items:
        out.append(f"./pq2 --device {dev} golden capture")
    if "model capture" in items:
        out.append(f"./pq2 --device {dev} golden capture --model")
    if {"golden capture", "model capture"} & set(items):
        files.append(f"golden/{key}")
    if files:
        out.append(f"git add {' '.join(files)} && git commit -m '{key}: exactness record and golden captures'")
    return out


def warning(st: dict) -> str | None:
    """The block cli.main prints on stderr before a command; None when nothing is missing."""
    if not st["missing"]:
        return None
    lines = [f"pq2verify: WARNING: backend {st['key']} is missing records of its own:"]
    lines += [f"  - {m['detail']}" for m in st["missing"]]
    lines.append(f"  make them (the first steps on a new backend, {st['doc']}):")
    lines += [f"    {i}. {s}" for i, s in enumerate(st["steps"], 1)]
    return "\n".join(lines)


def line(st: dict | None) -> str | None:
    """One line for a Markdown or HTML report; None when nothing is missing (or no record)."""
    if not isinstance(st, dict) or not st.get("missing"):
        return None
    what = "; ".join(str(m.get("detail", m)) if isinstance(m, dict) else str(m) for m in st["missing"])
    return (f"WARNING: backend {st['key']} is missing records of its own: {what}. Make them "
            f"({st.get('doc', DOC)}): {'; '.join(st.get('steps', []))}")


def key_for(args) -> str | None:
    """The backend key a parsed command line runs on: golden's --backend where it names one,
    else this process's. None where it cannot be known yet (golden --backend cuda without a
    GPU: golden refuses it itself)."""
    from kernels import backend
    choice = getattr(args, "backend", "auto") if getattr(args, "command", None) == "golden" else "auto"
    if choice == "interpreter":
        return "interpreter"
    if choice == "cuda" and backend.device() != "cuda":
        # computed without importing the kernels, which would pin this process to the CPU mode
        if not backend.cuda_available():
            return None
        import torch
        major, minor = torch.cuda.get_device_capability()
        return f"sm{major}{minor}"
    return backend.golden_key()


def announce(args) -> str | None:
    """The warning for a command about to run, or None (nothing missing, a command that runs
    nothing on this backend: check --render, or a gsm8k worker, whose parent said it)."""
    if getattr(args, "render", None) or getattr(args, "run_only", None):
        return None
    key = key_for(args)
    return None if key is None else warning(status(key))
