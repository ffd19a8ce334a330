#!/usr/bin/env bash
# Call 2: the bench's own run (issues 27/28 Done-when), then ncu of small_mma at M = 2 and 16
set -o pipefail
T0=$(date +%s)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv > $OUT/env-bench.txt
git log -1 --format=%H >> $OUT/env-bench.txt 2>/dev/null
if [ -z "${SKIP_BENCH:-}" ]; then
timeout ${TB:-400} python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
  --m ${BM_:-1,2,4,8,16,2048} --step-m ${SM_:-1,2,4,8,16} --budget-s ${BUDGET:-330} \
  --json $OUT/bench.json --jsonl $OUT/bench.jsonl --report $OUT/bench.md > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s"; grep -A30 "Chained decode step" $OUT/bench.md | head -30 | cut -c1-200
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-bench.txt
MET=smsp__inst_executed.sum,dram__bytes_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers
[ -n "${SKIP_NCU:-}" ] && exit 0
for spec in ${NCU:-small_mma:gate_up:2 small_mma:gate_up:16 small_mma:down:2 small_mma:down:16 gemv:gate_up:1 gemv:down:1 small_mma:in_proj:16 small_mma:out:16 gemv:out:1}; do
  LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - T0) )); [ $LEFT -lt 40 ] && break
  p=${spec%%:*}; r=${spec#*:}; s=${r%%:*}; m=${r##*:}
  timeout 40 ncu --kernel-name regex:_${p}_kernel --launch-skip 5 --launch-count 1 --csv \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --metrics smsp__inst_executed.sum,dram__bytes_read.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio \
    python3 tools/profile/decode_kernel.py $p $s $m > $OUT/ncu-$p-$s-m$m.csv 2>&1
  echo "ncu $p $s M=$m rc=$?"; python3 results/2026-12-07-decode-prefill-causes-h100/ncu_brief.py $OUT/ncu-$p-$s-m$m.csv
done
echo "done at $(( $(date +%s) - T0 )) s"
