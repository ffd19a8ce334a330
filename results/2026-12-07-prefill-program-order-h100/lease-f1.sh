#!/usr/bin/env bash
# call 1: mmq_wgmma's program order A/B at M = 8192 (and 4096); keep or revert; the exact record
CALL=f1; source lease-pre.sh
timeout 200 python3 lease-prefill_order_ab.py $OUT/order-ab.json --m 8192,4096 \
  --shapes down,gate_up,out,lm_head,in_proj,qkv --rounds 5 --budget-s 170 \
  --variants '{"g0": {"GROUP_M": 0}, "g8": {"GROUP_M": 8}, "g16": {"GROUP_M": 16}, "g4": {"GROUP_M": 4}}' > $OUT/order-ab.log 2>&1
at ab $?; cut -c1-330 $OUT/order-ab.log | tail -14
rm -f /tmp/revert /tmp/exact-sm90.json
if python3 lease-decide.py $OUT/order-ab.json > $OUT/decide.txt; then KEEP=1; else KEEP=0; tar xf lease-orig.tar; touch /tmp/revert; fi
cat $OUT/decide.txt; echo "KEEP=$KEEP" >> $OUT/decide.txt
if [ $KEEP = 1 ]; then
  timeout 200 python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths mmq_wgmma > $OUT/derive.log 2>&1
  at derive $?; tail -4 $OUT/derive.log | cut -c1-250; cp pq2verify/verified/exact-sm90.json $OUT/; cp pq2verify/verified/exact-sm90.json /tmp/
  LEFT=$(( 520 - ($(date +%s) - T0) ))
  if [ $LEFT -gt 90 ]; then
    timeout $LEFT python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick --m 8192 --shapes lm_head,down \
      --step-m none --budget-s $(( LEFT - 40 )) --json $OUT/bench8192.json --report $OUT/bench8192.md > $OUT/bench8192.log 2>&1
    at bench8192 $?; tail -3 $OUT/bench8192.log | cut -c1-300
  fi
fi
(cd $OUT && tar czf f1.tgz --ignore-failed-read bench8192.png bench8192.jsonl 2>/dev/null; true); ls -la $OUT
