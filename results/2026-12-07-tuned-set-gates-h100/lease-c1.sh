#!/usr/bin/env bash
# call 1: the bench's own run (issues 27/28 Done-when, M = 512 and 8192 reported), then the sanitizer
CALL=c1; source lease-pre.sh
timeout ${TB:-390} python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
  --m 1,2,4,8,16,512,2048,8192 --step-m 1,2,4,8,16 --budget-s ${BUDGET:-340} \
  --json $OUT/bench.json --jsonl $OUT/bench.jsonl --report $OUT/bench.md > $OUT/bench.log 2>&1
at bench $?; tail -3 $OUT/bench.log | cut -c1-300; grep -A9 "Chained decode step" $OUT/bench.md | head -10 | cut -c1-220
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-c1.txt
SC=$(( ${DEADLINE:-560} - ($(date +%s) - T0) - 15 )); echo "sanitize cap $SC s"
OUT=$OUT bash tools/ci/gpu_pass.sh sanitize:$SC > $OUT/pass-c1.log 2>&1; at sanitize $?
tail -5 $OUT/pass-c1.log
(cd $OUT && tar czf c1.tgz bench.png bench.jsonl r && rm -rf r bench.jsonl) ; ls -la $OUT
