"""Compare a one-GPU `check --json` with the `--shard i/n` runs of the same selection: the same
cases, each with the same verdict and the same figures. Usage: shard_compare.py ONE.json SHARD.json..."""
import json
import sys

KEYS = ("ok", "rel_rms_quantized", "rel_rms_dense", "elem_ratio", "max_ulp", "dots_exact", "claim_held",
        "deterministic", "written", "guards_intact", "batch_invariant", "nan_exact")


def main(one, *shards):
    a = {r["case"]: r for r in json.load(open(one))["cases"]}
    b = {}
    for f in shards:
        for r in json.load(open(f))["cases"]:
            if r["case"] in b:
                print(f"case {r['case']} in more than one shard")
                return 1
            b[r["case"]] = r
    diff = [c for c in a if c not in b or any(a[c].get(k) != b[c].get(k) for k in KEYS)]
    extra = [c for c in b if c not in a]
    print(f"one GPU: {len(a)} cases, {sum(r['ok'] for r in a.values())} PASS; shards: {len(b)} cases, "
          f"{sum(r['ok'] for r in b.values())} PASS; differing: {len(diff)}; only in shards: {len(extra)}")
    for c in (diff + extra)[:10]:
        print("  differs:", c)
    return 0 if not diff and not extra else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
