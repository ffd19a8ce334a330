#!/usr/bin/env bash
# call B: gemv_pair's sm_90 records (exact entry, golden captures), then the GPU suite on the tree
CALL=b1; source .gpu/fin/pre.sh
timeout 150 python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths gemv_pair > $OUT/derive-pair.log 2>&1
at derive $?; tail -6 $OUT/derive-pair.log | cut -c1-250; cp pq2verify/verified/exact-sm90.json $OUT/
timeout 150 python3 -m pq2verify.cli --device cuda golden capture --paths gemv_pair > $OUT/golden-capture.log 2>&1
at capture $?; tail -4 $OUT/golden-capture.log | cut -c1-250
git status --porcelain golden | awk '{print $2}' > $OUT/golden-files.txt; tar czf $OUT/golden-sm90.tgz $(cat $OUT/golden-files.txt)
wc -l < $OUT/golden-files.txt
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:${CAP:-400}; at suite $?
gzip -c $OUT/r/gpusuite.log > $OUT/gpusuite.log.gz; grep -E "passed|failed" $OUT/r/gpusuite.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -30 | cut -c1-300; rm -f $OUT/r/gpusuite.xml
