#!/usr/bin/env bash
# call C: the bench's own run on the final tree (gemv_pair in tuned; cublas with FP32 reductions)
CALL=c; source ../2026-12-07-decode-gemv-pair-h100/lease-pre.sh
B=${BUDGET:-330}
timeout $((B + 60)) python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
  --m 1,2,4,8,16,512,2048 --step-m 1,2,4,8,16 --budget-s $B \
  --json $OUT/bench.json --jsonl $OUT/bench.jsonl --report $OUT/bench.md > $OUT/bench.log 2>&1
at bench $?; tail -45 $OUT/bench.log | cut -c1-220
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-$CALL.txt
(cd $OUT && xz -k bench.log bench.json 2>/dev/null; rm -f bench.log bench.json); ls -la $OUT
