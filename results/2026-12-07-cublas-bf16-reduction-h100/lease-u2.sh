#!/usr/bin/env bash
# call 2: the GPU suite on the final tree
CALL=u2; source .gpu/fin/pre.sh
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:${CAP:-540}; at suite $?
gzip -c $OUT/r/gpusuite.log > $OUT/gpusuite.log.gz; grep -E "passed|failed" $OUT/r/gpusuite.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20; rm -f $OUT/r/gpusuite.xml
