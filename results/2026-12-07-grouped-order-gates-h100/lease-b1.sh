#!/usr/bin/env bash
# call 1: the bench's own run on the final tree (issues 27/28 Done-when), prefill 512-8192 included
CALL=b1; source .gpu/fin/pre.sh
mkdir -p /tmp/parts && cp .carry/* /tmp/parts/ 2>/dev/null; ls /tmp/parts
timeout 540 python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
  --m 1,2,4,8,16,512,2048,8192 --step-m 1,2,4,8,16 --budget-s 420 \
  --json $OUT/bench.json --jsonl $OUT/bench.jsonl --report $OUT/bench.md > $OUT/bench.log 2>&1
at bench $?; tail -50 $OUT/bench.log | cut -c1-200
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-$CALL.txt
(cd $OUT && xz -k bench.log bench.json 2>/dev/null; tar cf b1.tar bench.log.xz bench.json.xz bench.jsonl bench.png 2>/dev/null; rm -f bench.log.xz bench.json.xz bench.jsonl bench.png); ls -la $OUT
