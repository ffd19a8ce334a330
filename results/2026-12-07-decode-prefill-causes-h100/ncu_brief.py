import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print(open(sys.argv[1]).read()[-600:]); sys.exit()
h = rows[0]; ni, ui, vi = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
want = ("Duration", "Registers Per Thread", "Grid Size", "Achieved Occupancy", "Theoretical Occupancy",
        "Issued Warp Per Scheduler", "No Eligible", "Eligible Warps Per Scheduler", "Active Warps Per Scheduler",
        "Warp Cycles Per Issued Instruction", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput",
        "smsp__inst_executed.sum", "dram__bytes_read.sum", "Waves Per SM", "Block Limit Registers", "Block Limit Shared Mem")
out = []
for r in rows[1:]:
    if r[ni].startswith("smsp__average_warps_issue_stalled"):
        out.append(r[ni].split('stalled_')[1].split('_per_')[0] + '=' + r[vi])
    elif r[ni] in want:
        out.append(f"{r[ni]}={r[vi]}{r[ui] if r[ui] not in ('', 'inst') else ''}")
print("  " + "; ".join(out))
