"""`check --derive-exact`: the exact set is derived, not written by hand. Each tuned path's
bit-identity to its legacy counterpart is tested on the case matrix, and which claims held is
recorded with provenance (only when asked: the record is tracked in git); at run time the
`exact` set uses only the paths it says held."""
import json
from pathlib import Path

from . import cases, checks, dispatch, kernelsets, provenance, registry
from .bits import same_bits


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


def derive_exact(shapes: str, device, console, *, paths=None, record: bool = False, json_out=None) -> int:
    """Test the tuned paths (all, or `paths`) against their counterparts and print the verdict.
    json_out: also write it there. record: write it to verified/exact-<backend>.json, which the
    exact set reads (with `paths`: replace just those entries). Exit code 1 if a claim fails."""
    names = tuned_paths(paths)
    prov = provenance.collect()
    result = {}
    for p in map(registry.get, names):
        q = registry.get(p.counterpart)
        tried = held = 0
        first_diff = None
        for c in cases.check_cases(shapes, paths=[p.name]):
            if not q.serves(c.m) or c.layout not in q.layouts:
                continue
            inp = checks.Inputs(c, device)
            y1, _ = checks.call(p, inp)
            y2, _ = checks.call(q, inp)
            tried += 1
            same = same_bits(y1, y2)
            held += same
            if not same and first_diff is None:
                first_diff = c.repro()
        result[p.name] = {"counterpart": q.name, "cases": tried, "identical": held,
                          "held": tried > 0 and held == tried, "first_difference": first_diff,
                          "claimed": p.bit_identical_to == q.name}
        console.print(f"{p.name} vs {q.name}: {held}/{tried} cases bit-identical"
                      + ("" if first_diff is None else f" (first difference: {first_diff})"))
    key = dispatch.backend_key(__import__("torch").device(device if device != "cpu" else "cpu"))
    data = {"provenance": prov, "shapes": shapes, "paths": result}
    if json_out:
        Path(json_out).write_text(json.dumps(data, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    out = kernelsets.verified_file(key)
    if record:
        if paths is not None:
            data = _merge(out, data, names)
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
        dispatch.clear_cache()
        held = sorted(n for n, r in data["paths"].items() if r["held"])
        used = [n for n in held if not registry.get(n).deselected]
        parked = [n for n in held if registry.get(n).deselected]
        console.print(f"wrote {out}; exact set on {key}: tuned paths {used or 'none'} + legacy"
                      + (f" ({', '.join(parked)} verified too, but deselected from the tuned set, so not used)"
                         if parked else ""))
    else:
        console.print(f"not recorded: the exact set on {key} still reads {out} (--record writes it)")
    # A path that claims bit-identity and fails it is a failure, not just 'not in exact'.
    broken = [n for n, r in result.items() if r["claimed"] and not r["held"]]
    for n in broken:
        console.print(f"[red]FAIL[/] {n} claims bit-identity to {result[n]['counterpart']} but it does not hold: "
                      f"{result[n]['first_difference']}")
    return 1 if broken else 0
