#!/usr/bin/env bash
# (as run: a copy of the call's script; .gpu/head held the tree's files without the stages, git show 579e15b:FILE)
# One call: gemv num_stages A/B at M = 1; if the chooser (stages) wins the step with equal bits,
# derive gemv's record and run the GPU suite + golden on this tree (stages); otherwise restore
# the tree without stages (.gpu/head) and run the bench's own legacy-vs-tuned run instead.
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv > $OUT/env.txt
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> $OUT/env.txt
V=${VARIANTS:-'{"chooser": {}, "old": {"num_stages": 1}}'}
timeout ${TAB:-150} python3 tools/tune/step_ab.py $OUT/ab.json --m 1 --shapes gate_up,down,in_proj,qkv,out,lm_head --sol --rounds ${ROUNDS:-4} --variants "$V" > $OUT/ab.log 2>&1
at step_ab $?; grep -v "^ " $OUT/ab.log | grep -v "SOL read " | sed -E 's/ +/ /g' | cut -c1-120
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env.txt
WIN=$(python3 -c '
import json; r = json.load(open("'$OUT'/ab.json"))["step"]["M=1"]
print(int(r["old"]["speedup_vs_first"] < 0.99 and r["chooser"]["bits_equal"] is not None and "old" in r["chooser"]["bits_equal"]))' 2>&1)
echo "stages win: $WIN"
mkdir -p $OUT/r
if [ "$WIN" = "1" ]; then
  timeout ${TD:-120} python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths gemv > $OUT/r/derive.log 2>&1
  at derive $?; tail -2 $OUT/r/derive.log | cut -c1-200; cp pq2verify/verified/exact-sm90.json $OUT/
  (timeout 100 python3 -m pq2verify.cli --device cuda golden verify --json $OUT/r/golden-verify.json > $OUT/r/golden.log 2>&1; at golden $? >> $OUT/r/golden.log) &
  timeout $(( ${DEADLINE:-400} - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider -p no:randomly --device cuda tests/test_gemv_ring.py tests/test_graphs.py tests/test_pdl_overlap.py tests/test_paths.py -k "gemv and not int_gemv or test_gemv_ring" -n 8 -rfE --tb=short > $OUT/r/tests.log 2>&1
  at tests $?; wait; tail -2 $OUT/r/golden.log; tail -3 $OUT/r/tests.log | cut -c1-300
  rm -f $OUT/r/gpusuite.xml
else
  cp -r .gpu/head/. .
  LEFT=$(( ${DEADLINE:-400} - ($(date +%s) - T0) - 40 ))
  timeout $(( LEFT + 30 )) python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick --step-m 1,2,4,8,16 \
    --budget-s $LEFT --json $OUT/r/bench.json --jsonl $OUT/r/bench.jsonl --report $OUT/r/bench.md > $OUT/r/bench.log 2>&1
  at bench $?; grep -A30 "^## Targets" $OUT/r/bench.md | cut -c1-400; tail -4 $OUT/r/bench.log | cut -c1-300
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env.txt
fi
cd $OUT && tar czf r.tgz r && rm -rf r
