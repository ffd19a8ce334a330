"""`check --derive-exact`: the exact set is derived, not written by hand. Each tuned path's
bit-identity to its legacy counterpart is tested on the case matrix, and which claims held is
recorded with provenance; at run time the `exact` set uses only those paths."""
import json

from . import checks, dispatch, provenance, registry


def derive_exact(shapes: str, device, console) -> int:
    prov = provenance.collect()
    result = {}
    for p in registry.paths(kset="tuned"):
        if p.counterpart is None:
            continue
        q = registry.get(p.counterpart)
        tried = held = 0
        first_diff = None
        for c in checks.cases(shapes, paths=[p.name]):
            if not q.serves(c.m) or c.layout not in q.layouts:
                continue
            inp = checks.Inputs(c, device)
            y1, _ = checks.call(p, inp)
            y2, _ = checks.call(q, inp)
            tried += 1
            same = bool((checks._bits(y1) == checks._bits(y2)).all())
            held += same
            if not same and first_diff is None:
                first_diff = c.repro()
        result[p.name] = {"counterpart": q.name, "cases": tried, "identical": held,
                          "held": tried > 0 and held == tried, "first_difference": first_diff,
                          "claimed": p.bit_identical_to == q.name}
        console.print(f"{p.name} vs {q.name}: {held}/{tried} cases bit-identical"
                      + ("" if first_diff is None else f" (first difference: {first_diff})"))
    key = dispatch.backend_key(__import__("torch").device(device if device != "cpu" else "cpu"))
    dispatch.VERIFIED_DIR.mkdir(exist_ok=True)
    out = dispatch.VERIFIED_DIR / f"exact-{key}.json"
    out.write_text(json.dumps({"provenance": prov, "shapes": shapes, "paths": result}, indent=1) + "\n")
    dispatch.clear_cache()
    held = sorted(n for n, r in result.items() if r["held"])
    used = [n for n in held if not registry.get(n).deselected]
    parked = [n for n in held if registry.get(n).deselected]
    console.print(f"wrote {out}; exact set on {key}: tuned paths {used or 'none'} + legacy"
                  + (f" ({', '.join(parked)} verified too, but deselected from the tuned set, so not used)"
                     if parked else ""))
    # A path that claims bit-identity and fails it is a failure, not just 'not in exact'.
    broken = [n for n, r in result.items() if r["claimed"] and not r["held"]]
    for n in broken:
        console.print(f"[red]FAIL[/] {n} claims bit-identity to {result[n]['counterpart']} but it does not hold: "
                      f"{result[n]['first_difference']}")
    return 1 if broken else 0
