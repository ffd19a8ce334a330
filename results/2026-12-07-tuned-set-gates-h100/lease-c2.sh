#!/usr/bin/env bash
# call 2: the GPU suite on this tree
CALL=c2; source lease-pre.sh
TS=$(( ${DEADLINE:-585} - 25 )); echo "suite cap $TS s, $W workers"
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$TS > $OUT/pass-c2.log 2>&1; at suite $?
grep -E "passed|failed" $OUT/r/gpusuite.log | tail -1 | cut -c1-300
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20 | cut -c1-300
gzip -f $OUT/r/gpusuite.log; (cd $OUT && tar czf c2.tgz r && rm -rf r); ls -la $OUT
