"""The verdict rows of a check / golden verify / selftest --json file, or of a replay --markdown
report, without timings or floating metrics: two trees' rows compare equal exactly when their
verdicts are the same (the GPU half of the before/after comparison tests/test_snapshot.py makes
on the CPU).

    python tools/ci/verdict_rows.py check before/check.json after/check.json
    python tools/ci/verdict_rows.py golden|selftest|replay A B

Prints the row count of each and the rows that differ; exit 0 when none differ."""
import json
import sys

CHECK_KEYS = ("case", "repro", "ok", "failed", "dots_exact", "claim", "claim_held", "deterministic", "written",
              "guards_intact", "batch_invariant", "nan_exact", "seed")


def check(d):
    return [{k: r.get(k) for k in CHECK_KEYS} for r in d["cases"]]


def golden(d):
    return [{"case": o["case"], "status": o["status"], "comparison": o["comparison"].split()[0]}
            for o in d["outcomes"]]


def selftest(d):
    return [{"fault": v["fault"], "path": v["path"], "status": v["status"], "caught_by": v.get("caught_by")}
            for v in d["verdicts"]]


def replay(text):
    """The separation table's verdict columns and the overall line."""
    rows = []
    if "## Separation" in text:
        for ln in text.split("## Separation", 1)[1].split("\n\n")[1].splitlines()[2:]:
            c = [x.strip() for x in ln.strip("|").split("|")]
            rows.append({"variant": c[0], "verdict": c[2], "as expected": c[3], "failed checks": c[4]})
    rows += [{"overall": ln} for ln in text.splitlines() if ln.startswith("**Separation")]
    return rows


def rows(kind, path):
    with open(path) as f:
        return replay(f.read()) if kind == "replay" else globals()[kind](json.load(f))


def main(argv):
    kind, a, b = argv
    ra, rb = rows(kind, a), rows(kind, b)
    key = (lambda r: json.dumps(r, sort_keys=True))
    sa, sb = {key(r) for r in ra}, {key(r) for r in rb}
    print(f"{kind}: {len(ra)} rows in {a}, {len(rb)} in {b}; {len(sa - sb)} only in the first, "
          f"{len(sb - sa)} only in the second")
    for r in sorted(sa - sb)[:20]:
        print("  -", r)
    for r in sorted(sb - sa)[:20]:
        print("  +", r)
    return 0 if sa == sb and len(ra) == len(rb) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
