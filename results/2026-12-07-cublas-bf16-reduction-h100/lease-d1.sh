#!/usr/bin/env bash
# call 1: the sm90 exact record re-derived for the new prepare.py (every path, as the record holds)
CALL=d1; source .gpu/fin/pre.sh
timeout 300 python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b > $OUT/derive.log 2>&1
at derive $?; tail -12 $OUT/derive.log | cut -c1-250; cp pq2verify/verified/exact-sm90.json $OUT/
