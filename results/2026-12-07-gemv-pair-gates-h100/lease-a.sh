#!/usr/bin/env bash
# call A: gemv_pair's sm_90 golden captures, golden verify, then the GPU suite on the tree
CALL=a; source ../2026-12-07-decode-gemv-pair-h100/lease-pre.sh
timeout 120 python3 -m pq2verify.cli --device cuda golden capture --paths gemv_pair > $OUT/golden-capture.log 2>&1
at capture $?; tail -4 $OUT/golden-capture.log | cut -c1-250
git status --porcelain golden | awk '{print $2}' > $OUT/golden-files.txt; tar czf $OUT/golden-sm90.tgz $(cat $OUT/golden-files.txt)
wc -l < $OUT/golden-files.txt
timeout 60 python3 -m pq2verify.cli --device cuda golden verify --json $OUT/golden-verify.json > $OUT/golden-verify.log 2>&1
at verify $?; tail -3 $OUT/golden-verify.log | cut -c1-250
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:${CAP:-480}; at suite $?
gzip -c $OUT/r/gpusuite.log > $OUT/gpusuite.log.gz; grep -E "passed|failed" $OUT/r/gpusuite.log | tail -3
grep -E "^FAILED|^ERROR|Error" $OUT/r/gpusuite.log | head -30 | cut -c1-400; rm -f $OUT/r/gpusuite.xml
