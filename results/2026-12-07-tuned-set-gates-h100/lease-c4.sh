#!/usr/bin/env bash
# call 4: the GSM8K A/B and the replay gate with the tuned set, side by side on the one GPU
CALL=c4; source lease-pre.sh
C=$(( ${DEADLINE:-560} - 40 ))
OUT=$OUT bash tools/ci/gpu_pass.sh gsm8k+replay:$C > $OUT/pass-c4.log 2>&1; at pass $?
tail -14 $OUT/pass-c4.log | cut -c1-300
(cd $OUT && tar czf c4.tgz r && rm -rf r); ls -la $OUT
