#!/usr/bin/env bash
# One GPU call for gemv's shared-memory pipeline (num_stages), on a checkout of ab653f6 (run
# from its root; $OUT: where the logs go). First timed against the configs it replaces (outputs
# compared bit for bit), then gemv's exactness re-derived and recorded (the suite reads the
# record), then the GPU suite and golden verify side by side. Sized for one 10-minute call.
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > $OUT/env.txt
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> $OUT/env.txt
V='{"chooser": {}, "old": {"num_stages": 1}, "s2": {"num_stages": 2, "DEPTH": 1}, "s4": {"num_stages": 4, "DEPTH": 1}}'
timeout ${TAB:-190} python3 tools/tune/step_ab.py $OUT/ab.json --m 1 --shapes gate_up,down,in_proj,qkv,out,lm_head --sol --rounds ${ROUNDS:-4} --variants "$V" > $OUT/ab.log 2>&1
at step_ab $?; grep -v "^ " $OUT/ab.log | grep -v "SOL read " | sed -E 's/ +/ /g' | cut -c1-120
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env.txt
mkdir -p $OUT/r
timeout ${TD:-120} python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths gemv > $OUT/r/derive.log 2>&1
at derive $?; tail -2 $OUT/r/derive.log | cut -c1-200; cp pq2verify/verified/exact-sm90.json $OUT/
# the suite's workers: 9 share an H200's 139 GB; an 80 GB card holds 5 under the per-worker cap
W=$(python3 -c 'import torch; print(9 if torch.cuda.get_device_properties(0).total_memory > 100e9 else 5)')
(timeout 100 python3 -m pq2verify.cli --device cuda golden verify --json $OUT/r/golden-verify.json > $OUT/r/golden.log 2>&1; at golden $? >> $OUT/r/golden.log) &
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$(( ${DEADLINE:-570} - ($(date +%s) - T0) )) > $OUT/r/pass.log 2>&1
at "gpusuite(-n $W)" $?; wait; tail -2 $OUT/r/golden.log
grep -E "^(FAILED|ERROR)" $OUT/r/gpusuite.log | head -20; tail -1 $OUT/r/gpusuite.log | cut -c1-200
cd $OUT && rm -f r/gpusuite.xml && tar czf r.tgz r && rm -rf r
