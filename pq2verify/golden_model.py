"""Golden captures of the real thing: the inputs and outputs of every PQ2 projection of the
GSM8K model (pq2verify.gsm8k.model) at decode positions 1, 32 and 128.

The model is run greedily on the first GSM8K test question; every pq2_matmul call on one of
the model's PQ2 weights is recorded at the chosen positions (a weight's call i is decode
position i; call 0 reads the prompt), with the path that served it. `verify_model` re-runs
each recorded call on that path and requires the recorded bytes. Captures live beside the
case captures: golden/<backend>/model/ (manifest.json + model.safetensors).
"""
import json
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from kernels import backend, dispatch
from . import provenance
from .golden import (FORMAT, MANIFEST, GoldenIntegrityError, _provenance, _save_tensors, compare, load,
                     tensor_sha256)
from kernels.format import PQ2Weight

POSITIONS = (1, 32, 128)
# The runner is passed in (the commands pass the GSM8K app's, pq2verify.gsm8k.model): this
# module knows the contract, never the app.
CONTRACT = """a model runner must provide
  prepare(path, digits, device) -> an object with .model (a transformers causal LM, or anything
      called as model(input_ids=..., past_key_values=..., use_cache=True) -> .logits,
      .past_key_values) and .tokenizer (tokenizer(text, return_tensors='pt').input_ids),
whose PQ2 projections call kernels.dispatch.pq2_matmul on PQ2Weights that its modules hold
(directly, or as .w of an attribute, e.g. a stack of sibling projections)."""


class ModelRunnerMissing(RuntimeError):
    """`golden --model` without a usable GSM8K model runner."""


def checked(runner):
    """The runner if it meets the contract's entry point, else ModelRunnerMissing."""
    if runner is None:
        raise ModelRunnerMissing(f"golden --model: no model runner was given.\n{CONTRACT}")
    if not callable(getattr(runner, "prepare", None)):
        raise ModelRunnerMissing(f"golden --model: the model runner {getattr(runner, '__name__', runner)!r} "
                                 f"has no prepare().\n{CONTRACT}")
    return runner


def pq2_weights(model) -> dict[int, tuple[str, PQ2Weight]]:
    """id(weight) -> (name, weight) for each PQ2Weight the model's modules hold; siblings that
    share one stacked weight get one name, e.g. 'layers.0.self_attn.q_proj+k_proj+v_proj'."""
    found = {}
    for mname, mod in model.named_modules():
        for attr, v in vars(mod).items():
            w = v if isinstance(v, PQ2Weight) else getattr(v, "w", None)
            if isinstance(w, PQ2Weight):
                label = f"{mname}.{attr}" if v is w else mname
                found.setdefault(id(w), ([], w))[0].append(label)
    out = {}
    for key, (names, w) in found.items():
        parent = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
        same = all(n.rsplit(".", 1)[0] == parent for n in names) and parent
        out[key] = (f"{parent}." + "+".join(n.rsplit(".", 1)[1] for n in names) if same and len(names) > 1
                    else "+".join(names), w)
    return out


@contextmanager
def recording(weights: dict, positions, tensors: dict, records: list):
    """Record x, y and the serving path of pq2_matmul calls on `weights` at the positions."""
    real = dispatch.pq2_matmul
    calls = Counter()

    def rec(x, w, **kw):
        with dispatch.trace() as t:
            y = real(x, w, **kw)
        hit = weights.get(id(w))
        if hit is not None:
            name = hit[0]
            i = calls[name]
            calls[name] += 1
            if i in positions:
                key = f"{name}@{i}"
                tensors[key + "/x"] = x.detach().reshape(-1, x.shape[-1]).to("cpu", copy=True)
                tensors[key + "/y"] = y.detach().reshape(-1, y.shape[-1]).to("cpu", copy=True)
                records.append({"layer": name, "position": i, "key": key, "path": next(iter(t)),
                                "kernels": kw.get("kernels") or dispatch.kernel_set()})
        return y

    dispatch.pq2_matmul = rec
    try:
        yield calls
    finally:
        dispatch.pq2_matmul = real


def _prompt() -> str:
    f = provenance.ROOT / "pq2verify" / "gsm8k" / "data" / "test.jsonl"
    with open(f) as fh:
        return json.loads(fh.readline())["question"]


def greedy(model, tok, prompt: str, steps: int, device) -> None:
    """The prompt, then `steps` greedy decode steps of one token each, with the model's cache."""
    ids = tok(prompt, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)


def capture_model(dest: Path, device, runner, *, positions=POSITIONS, log=print) -> dict:
    """Run `runner`'s model greedily and record its PQ2 projection calls at `positions`."""
    conv = checked(runner).prepare(None, None, device)
    weights = pq2_weights(conv.model)
    if not weights:
        raise ModelRunnerMissing(f"golden --model: the runner's model holds no PQ2Weight.\n{CONTRACT}")
    tensors, records = {}, []
    prompt = _prompt()
    with recording(weights, set(positions), tensors, records) as calls:
        greedy(conv.model, conv.tokenizer, prompt, max(positions), device)
    missing = sorted(set(positions) - {r["position"] for r in records})
    if missing:
        log(f"warning: no calls at decode positions {missing}")
    silent = sorted(name for name, _ in weights.values() if not calls[name])
    if silent:
        log(f"warning: {len(silent)} PQ2 weights were never called, e.g. {silent[:3]}")
    by_name = {name: w for name, w in weights.values()}
    sha = {}
    for r in records:
        if r["layer"] not in sha:
            sha[r["layer"]] = tensor_sha256(by_name[r["layer"]].data)
        r["weight_sha256"] = sha[r["layer"]]
        r["y_sha256"] = tensor_sha256(tensors[r["key"] + "/y"])
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = {"model.safetensors": _save_tensors(dest, "model.safetensors", tensors)}
    man = {"format": FORMAT, "kind": "model", "backend_key": backend.golden_key(), "backend": backend.name(),
           "model_id": getattr(conv, "model_id", None), "digits": getattr(conv, "digits", None),
           "prompt": prompt, "positions": list(positions), "files": files, "records": records, "cases": [],
           **_provenance(device)}
    (dest / MANIFEST).write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    log(f"recorded {len(records)} projection calls of {len(weights)} PQ2 weights into {dest}")
    return man


def verify_model(dest: Path, device, runner, *, log=None) -> list[tuple[str, str, str]]:
    """(key, status, detail) per recorded call: the recorded x through the recorded path on the
    model's weight must give the recorded y, byte for byte."""
    g = load(dest, kind="model")
    if g.manifest.get("kind") != "model":
        raise GoldenIntegrityError(f"{dest}: not a model capture (golden capture --model writes one)")
    conv = checked(runner).prepare(None, None, device)
    by_name = {name: w for name, w in pq2_weights(conv.model).values()}
    t = g.tensors("model.safetensors")
    sha = {}
    out = []
    for r in g.manifest["records"]:
        w = by_name.get(r["layer"])
        if w is not None and r["layer"] not in sha:
            sha[r["layer"]] = tensor_sha256(w.data)
        if w is None:
            out.append((r["key"], "error", "no such PQ2 weight in the model"))
        elif sha[r["layer"]] != r["weight_sha256"]:
            out.append((r["key"], "error", "the model's weight differs from the captured one"))
        elif r["key"] + "/x" not in t or r["key"] + "/y" not in t:
            out.append((r["key"], "integrity", "model.safetensors lacks its x or y"))
        elif tensor_sha256(t[r["key"] + "/y"]) != r["y_sha256"]:
            out.append((r["key"], "integrity", "its stored y does not match the recorded sha256"))
        elif tuple(t[r["key"] + "/x"].shape) != (t[r["key"] + "/y"].shape[0], w.k) or \
                tuple(t[r["key"] + "/y"].shape) != (t[r["key"] + "/x"].shape[0], w.n):
            out.append((r["key"], "integrity", f"stored x {tuple(t[r['key'] + '/x'].shape)} and y "
                        f"{tuple(t[r['key'] + '/y'].shape)} are not a whole call on the {w.n}x{w.k} weight"))
        else:
            x, want = t[r["key"] + "/x"], t[r["key"] + "/y"]
            # a fresh copy per call: the comparison never reads a buffer the kernel returned before
            y = dispatch.pq2_matmul(x.to(device, copy=True), w, path=r["path"]).to("cpu", copy=True)
            out.append((r["key"], *compare(y, want)))
        if log:
            log(out[-1])
    return out
