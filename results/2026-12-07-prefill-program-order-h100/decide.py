"""Exit 0 (keep GROUP_M = 8 for M > 2048) only if every variant's bits equal GROUP_M 0's, no row
is slower than 0.98x with GROUP_M 8, and the median over the M = 8192 rows is at least 1.03x."""
import json, statistics, sys
r = json.load(open(sys.argv[1]))["rows"]
bits = all(all(v.values()) for v in (x["bits_equal_first"] for x in r))
g8 = [x["speed_vs_first"]["g8"][0] for x in r]
big = [x["speed_vs_first"]["g8"][0] for x in r if x["m"] == 8192]
ok = bits and len(big) >= 3 and min(g8) >= 0.98 and statistics.median(big) >= 1.03
print(f"rows {len(r)} (M=8192: {len(big)}), bits equal {bits}, g8 min {min(g8) if g8 else None}, "
      f"median at 8192 {statistics.median(big) if big else None}: {'KEEP' if ok else 'REVERT'}")
sys.exit(0 if ok else 1)
