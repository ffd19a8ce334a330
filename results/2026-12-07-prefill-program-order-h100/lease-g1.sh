#!/usr/bin/env bash
# one call: mmq_wgmma's program order again (chooser GROUP_M 4 past M = 2048; M = 2048 and 512
# for the record), the sm90 exact record for the new source, then the GPU suite on this tree
CALL=g1; source lease-pre.sh
timeout 120 python3 lease-prefill_order_ab.py $OUT/order-ab2.json --m 8192,4096,2048,512 \
  --shapes down,gate_up,out,lm_head,in_proj,qkv --rounds 7 --budget-s 100 \
  --variants '{"g0": {"GROUP_M": 0}, "g4": {"GROUP_M": 4}}' > $OUT/order-ab2.log 2>&1
at ab $?; cut -c1-250 $OUT/order-ab2.log | tail -24
timeout 200 python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths mmq_wgmma > $OUT/derive.log 2>&1
at derive $?; tail -4 $OUT/derive.log | cut -c1-250; cp pq2verify/verified/exact-sm90.json $OUT/
TS=$(( ${DEADLINE:-585} - ($(date +%s) - T0) - 20 )); echo "suite cap $TS s, $W workers"
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$TS > $OUT/pass-g1.log 2>&1; at suite $?
grep -E "passed|failed" $OUT/r/gpusuite.log | tail -1 | cut -c1-300
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20 | cut -c1-300
gzip -f $OUT/r/gpusuite.log; (cd $OUT && tar czf g1.tgz r && rm -rf r); ls -la $OUT
