#!/usr/bin/env bash
# call 3: golden verify and the bench self-test (short: the model's third part rides along)
CALL=c3; source lease-pre.sh
OUT=$OUT bash tools/ci/gpu_pass.sh goldenverify:60 benchselftest:40 > $OUT/pass-c3.log 2>&1; at pass $?
cat $OUT/pass-c3.log | tail -12; (cd $OUT && tar czf c3.tgz r && rm -rf r); ls -la $OUT
