#!/usr/bin/env bash
# call C: gemv_pair's GPU check on the Bonsai shapes, then the bench's own run on the final tree
CALL=c1; source .gpu/fin/pre.sh
timeout 100 python3 -m pq2verify.cli --device cuda check --paths gemv_pair --shapes bonsai27b --skip-selfcheck \
  --json $OUT/check-pair.json --markdown $OUT/check-pair.md > $OUT/check-pair.log 2>&1
at check $?; tail -4 $OUT/check-pair.log | cut -c1-200
timeout 470 python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
  --m 1,2,4,8,16,512,2048 --step-m 1,2,4,8,16 --budget-s 400 \
  --json $OUT/bench.json --jsonl $OUT/bench.jsonl --report $OUT/bench.md > $OUT/bench.log 2>&1
at bench $?; tail -40 $OUT/bench.log | cut -c1-200
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-$CALL.txt
(cd $OUT && xz -k bench.log bench.json 2>/dev/null; tar cf c1.tar bench.log.xz bench.json.xz bench.jsonl bench.png 2>/dev/null; rm -f bench.log.xz bench.json.xz bench.jsonl bench.png); ls -la $OUT
