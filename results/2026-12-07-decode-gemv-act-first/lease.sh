#!/usr/bin/env bash
# one call: gemv's load-order A/B at M = 1 and the exact record, then the GPU suite on this tree
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $GPU"
case "$GPU" in *H200*) W=9;; *) W=6;; esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv > $OUT/env.txt
git log -1 --format=%H >> $OUT/env.txt
mkdir -p $OUT/a
timeout ${ABSEC:-130} python3 tools/tune/step_ab.py $OUT/a/ab.json --m 1 --shapes gate_up,down,out,in_proj,lm_head \
  --sol --rounds ${ROUNDS:-4} --variants '{"chooser": {}, "old": {"ACT_FIRST": false}, "first": {"ACT_FIRST": true}}' > $OUT/a/ab.log 2>&1
at ab $?; grep -vE "^\s*$" $OUT/a/ab.log | tail -32 | cut -c1-230
# the suite only where the chooser's order won the step in every round (else the change is dropped)
python3 - $OUT/a/ab.json <<'PY' || { echo "ACT_FIRST did not win the step: no suite"; (cd $OUT && tar czf a.tgz a && rm -rf a); exit 0; }
import json, sys
s = json.load(open(sys.argv[1]))["step"]["M=1"]["old"]
print("old / chooser speed on the step:", s["speedup_vs_first"], s["speedup_range"])
sys.exit(0 if s["speedup_range"][1] < 1.0 else 1)
PY
# the exact record: the suite's backend checks need it current for these sources
mkdir -p $OUT/r; OUT=$OUT bash tools/ci/gpu_pass.sh derive:100; at derive $?; tail -2 $OUT/r/derive.log | cut -c1-250
mv $OUT/r/* $OUT/a/; (cd $OUT && tar czf a.tgz a && rm -rf a)
TS=$(( ${DEADLINE:-590} - ($(date +%s) - T0) - 25 )); echo "suite cap $TS s"
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$TS; at suite $?
grep -E "passed|failed" $OUT/r/gpusuite.log | tail -1 | cut -c1-300
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20 | cut -c1-300
gzip -f $OUT/r/gpusuite.log; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env.txt
ls -R $OUT | head
