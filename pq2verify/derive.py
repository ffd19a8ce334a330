"""`check --derive-exact`: the exact set is derived, not written by hand. For each tuned path and
its legacy counterpart, bit identity is claimed only where it is proven:

(a) equal integer group dots: both paths write their dots, and they are equal on every case
    (the registry's dots_equal_to says so by construction; the check confirms it);
(b) the same declared FP32 fold order: kernelsets.same_fold on every (n, k, m) of the shape grid
    (pq2verify.tiles) that both serve, on this backend's configs; and the same Q8 scales, fold
    term and output rounding (both kernel files use prepare.quantize_q8, whose scale does not
    depend on the order, common.scale_accumulate and prepare.to_out);
and no sampled case differs. Floating paths and libraries declare no comparable order: never
proven this way. Where it is not proven, inputs built to tell fold orders apart
(pq2verify.adversarial: cancelling groups in every order, ties at the output rounding) run on
both paths on the shapes where the folds differ; a difference is recorded as the refutation,
with the command that shows it. Neither: "unproven". Only "proven" entries are held
(kernelsets.held); the record is written with provenance only when asked (it is tracked)."""
import inspect
import json
from pathlib import Path

from kernels import dispatch, sets as kernelsets
from . import adversarial, cases, checks, outputs, provenance, registry, tiles
from .bits import same_bits

# What the same Q8 scales, fold term and output rounding rest on: each name must be called in
# both kernel files (the one expression each; see kernels/common.py and kernels/prepare.py).
# mmq_wgmma's Gluon kernel (sm_90) spells the same two out: acc + d*xs*ws, and acc.to(dtype),
# which is what to_out is on a GPU. On a GPU both paths compile the same expression, so FMA
# contraction, where the compiler applies it, applies alike; the sampled cases check that.
EPILOGUE = ("quantize_q8(", "scale_accumulate(", "to_out(")
ADVERSARIAL_SHAPES = 4        # (k, m) shapes tried per path where the folds differ
ADVERSARIAL_GROUPS = 8        # groups a construction spans at most (the interpreter pays per row)


def tuned_paths(names=None) -> list[str]:
    """The tuned paths that have a legacy counterpart (all, or those named): what derive tests.
    A name that is not one of them is a ValueError naming --paths."""
    every = [p.name for p in registry.paths(kset="tuned") if p.counterpart is not None]
    if names is None:
        return every
    for n in names:
        if n not in every:
            what = "not a known path" if n not in registry.BY_NAME else "not a tuned path with a legacy counterpart"
            raise ValueError(f"--paths: {n!r} is {what}; --derive-exact tests {', '.join(every)}")
    return list(dict.fromkeys(names))


def _merge(out: Path, data: dict, names: list[str]) -> dict:
    """The record with only `names` replaced: entries kept from the previous record keep the
    provenance and shapes they were derived with."""
    if not out.exists():
        return data
    old = json.loads(out.read_text())
    kept = {n: {"provenance": old.get("provenance"), "shapes": old.get("shapes"), **r}
            for n, r in old.get("paths", {}).items() if n not in names}
    merged = {**kept, **data["paths"]}
    order = [p.name for p in registry.PATHS]
    rank = lambda n: order.index(n) if n in order else len(order)  # noqa: E731
    return {**data, "paths": {n: merged[n] for n in sorted(merged, key=rank)}}


def dots_chain(p: registry.Path, q: registry.Path) -> bool:
    """p's dots_equal_to chain reaches q (the registry declares their dots equal)."""
    seen, cur = set(), p
    while cur.dots_equal_to and cur.name not in seen:
        seen.add(cur.name)
        if cur.dots_equal_to == q.name:
            return True
        cur = registry.get(cur.dots_equal_to)
    return False


def epilogue(p: registry.Path) -> bool:
    """p's kernel file computes Q8, the fold term and the output rounding with the shared
    functions (EPILOGUE)."""
    import importlib
    src = inspect.getsource(importlib.import_module(p.module))
    return p.arithmetic == "integer" and all(s in src for s in EPILOGUE)


def _show(fold: dict | None, k: int) -> dict | None:
    """A fold with groups_per_split written 'G' where it is all groups (shape-free)."""
    if fold is None:
        return None
    return {f: ("G" if f == "groups_per_split" and v == k // 128 else v) for f, v in sorted(fold.items())}


def fold_grid(p: registry.Path, q: registry.Path, interpret: bool) -> dict:
    """Compare the declared folds on every (n, k, m) of the grid both serve: {points, differ,
    first_differ, orders}; orders: the distinct shape-free folds where they agree."""
    pts = differ = 0
    first, orders = None, []
    for n, k in tiles.grid(p.weight):
        for m in tiles.MS:
            if not (p.serves(m) and q.serves(m)):
                continue
            pts += 1
            if kernelsets.same_fold(p.name, q.name, n, k, m, interpret):
                f = _show(p.fold(n, k, m, interpret=interpret), k)
                if f not in orders:
                    orders.append(f)
                continue
            differ += 1
            if first is None:
                first = {"n": n, "k": k, "m": m, p.name: p.fold(n, k, m, interpret=interpret),
                         q.name: q.fold(n, k, m, interpret=interpret)}
    return {"points": pts, "differ": differ, "first_differ": first, "orders": orders}


def _search_shapes(p, q, interpret: bool) -> list[tuple[int, int, int]]:
    """(n, k, m) to run the construction on: its own row count, K of the grid, M both serve,
    where the declared folds differ (or one is undeclared); smallest first."""
    ks = sorted({k for _, k in tiles.grid(p.weight) if k // 128 >= 3})
    out = []
    for k in ks:
        n = len(adversarial.rows(k // 128, ADVERSARIAL_GROUPS))
        for m in tiles.MS:
            if p.serves(m) and q.serves(m) and not kernelsets.same_fold(p.name, q.name, n, k, m, interpret):
                out.append((n, k, m))
                break       # one M per K: the fold orders vary with K far more than with M
    return out[:ADVERSARIAL_SHAPES]


def search(p, q, device, interpret: bool, console=None) -> dict | None:
    """The first construction on which p and q differ (adversarial.compare's record), or None."""
    if p.weight != "pq2" or q.weight != "pq2":
        return None
    for n, k, m in _search_shapes(p, q, interpret):
        for dt in cases.DTYPES:
            if console is not None:
                console.print(f"  {p.name} vs {q.name}: cancelling groups and ties, K={k} M={m} {dt}")
            d = adversarial.compare(p, q, k, m, dt, device, span=ADVERSARIAL_GROUPS)
            if d is not None:
                return d
    return None


def judge(p, q, *, tried, identical, first_diff, dots_tried, dots_equal, first_dots_diff, folds,
          refutation) -> tuple[str, str]:
    """(rule, basis) of one path from its evidence: 'proven' needs (a) and (b) of the module
    docstring and no sampled difference; a difference anywhere is 'refuted'; else 'unproven'."""
    if first_dots_diff is not None:
        return "refuted", f"refuted: integer group dots differ on {first_dots_diff}"
    if refutation is not None:
        return "refuted", f"refuted: {refutation['input']} at K={refutation['k']} M={refutation['m']} " \
                          f"{refutation['dtype']}: {refutation['command']}"
    if first_diff is not None:
        return "refuted", f"refuted: bytes differ from {q.name} on the inputs of {first_diff}"
    missing = []
    if not (p.has_dots and q.has_dots):
        missing.append("no integer group dots on both paths")
    elif not dots_tried or dots_equal != dots_tried:
        missing.append("dots not compared on any case")
    if not (epilogue(p) and epilogue(q)):
        missing.append("Q8, fold term or output rounding not the shared functions on both")
    if folds["points"] == 0:
        missing.append("no grid shape served by both")
    elif folds["differ"]:
        f = folds["first_differ"]
        searched = ("no constructed input told them apart" if p.weight == "pq2"
                    else "no construction for dense weights")
        missing.append(f"declared fold orders differ or are not comparable on {folds['differ']} of "
                       f"{folds['points']} grid shapes (first {f['n']}x{f['k']} M={f['m']}: {f[p.name]} vs "
                       f"{f[q.name]}); {searched}")
    if not tried:
        missing.append("no case run")
    if missing:
        return "unproven", "unproven: " + "; ".join(missing)
    chain = f"; declared dots_equal_to {q.name}" if dots_chain(p, q) else ""
    orders = ", ".join(json.dumps(o, sort_keys=True) for o in folds["orders"])
    return "proven", (f"proven: equal dots ({dots_equal}/{dots_tried} cases{chain}) and fold order {orders} "
                      f"on all {folds['points']} grid shapes and Ms; same Q8 scales, fold term and output "
                      f"rounding ({', '.join(s[:-1] for s in EPILOGUE)}); {identical}/{tried} sampled cases "
                      "bit-identical")


def derive_path(p, q, shapes: str, device, key: str, console) -> dict:
    interpret = kernelsets.interpret_folds(key)
    tried = held = dots_tried = dots_equal = 0
    first_diff = first_dots_diff = None
    for c in cases.check_cases(shapes, paths=[p.name]):
        if not q.serves(c.m) or c.layout not in q.layouts:
            continue
        inp = checks.Inputs(c, device)
        y1, d1 = checks.call(p, inp, with_dots=True)
        y2, d2 = checks.call(q, inp, with_dots=True)
        tried += 1
        same = same_bits(y1, y2)
        held += same
        if not same and first_diff is None:
            first_diff = c.repro()
        if d1 is not None and d2 is not None:
            dots_tried += 1
            eq = bool((d1 == d2).all())
            dots_equal += eq
            if not eq and first_dots_diff is None:
                first_dots_diff = c.repro()
    folds = fold_grid(p, q, interpret)
    # searched even where a sampled case differs: a construction's command shows the bytes differ
    refutation = search(p, q, device, interpret, console) if first_dots_diff is None and folds["differ"] else None
    rule, basis = judge(p, q, tried=tried, identical=held, first_diff=first_diff, dots_tried=dots_tried,
                        dots_equal=dots_equal, first_dots_diff=first_dots_diff, folds=folds, refutation=refutation)
    return {"format": kernelsets.FORMAT, "counterpart": q.name, "rule": rule, "basis": basis,
            "held": rule == "proven", "claimed": p.bit_identical_to == q.name,
            "cases": tried, "identical": held, "first_difference": first_diff,
            "dots": {"cases": dots_tried, "equal": dots_equal, "first_difference": first_dots_diff,
                     "declared": dots_chain(p, q)},
            "folds": folds, "refutation": refutation, "sources": kernelsets.sources_digest(p.name, q.name)}


def derive_exact(shapes: str, device, console, *, paths=None, record: bool = False, json_out=None) -> int:
    """Derive each tuned path's rule (all, or `paths`) against its counterpart and print it.
    json_out: also write it there. record: write it to verified/exact-<backend>.json, which the
    exact set reads (with `paths`: replace just those entries). Exit code 1 if a path that claims
    bit identity is not proven."""
    names = tuned_paths(paths)
    kernelsets.clear_cache()
    prov = provenance.collect(status=False)     # the record it writes would change the status
    key = dispatch.backend_key(__import__("torch").device(device if device != "cpu" else "cpu"))
    result = {}
    for p in map(registry.get, names):
        q = registry.get(p.counterpart)
        r = result[p.name] = derive_path(p, q, shapes, device, key, console)
        console.print(f"{p.name} vs {q.name}: {r['identical']}/{r['cases']} cases bit-identical; {r['basis']}")
    data = {"provenance": prov, "shapes": shapes, "format": kernelsets.FORMAT, "paths": result}
    # A path that claims bit identity and is not proven is a failure, not just 'not in exact'.
    # The verdict is printed before any file is written (a failed write never loses it).
    broken = [n for n, r in result.items() if r["claimed"] and r["rule"] != "proven"]
    for n in broken:
        r = result[n]
        if r["rule"] == "refuted":
            shown = r["dots"]["first_difference"] or (r["refutation"] or {}).get("command") or r["first_difference"]
            console.print(f"[red]FAIL[/] {n} claims bit-identity to {r['counterpart']} but it does not hold: {shown}")
        else:
            console.print(f"[red]FAIL[/] {n} claims bit-identity to {r['counterpart']} but it is not proven: "
                          f"{r['basis']}")
    if json_out:
        outputs.write_text(json_out, json.dumps(data, indent=1) + "\n", "--json")
        console.print(f"wrote {json_out}")
    out = kernelsets.verified_file(key)
    if record:
        if paths is not None:
            data = _merge(out, data, names)
        out.parent.mkdir(exist_ok=True)
        outputs.write_text(out, json.dumps(data, indent=1) + "\n", "--record")
        dispatch.clear_cache()
        held = sorted(kernelsets.verified_exact(key))
        used = [n for n in held if not registry.get(n).deselected]
        parked = [n for n in held if registry.get(n).deselected]
        console.print(f"wrote {out}; exact set on {key}: tuned paths {used or 'none'} + legacy"
                      + (f" ({', '.join(parked)} proven too, but deselected from the tuned set, so not used)"
                         if parked else ""))
    else:
        console.print(f"not recorded: the exact set on {key} still reads {out} (--record writes it)")
    return 1 if broken else 0
