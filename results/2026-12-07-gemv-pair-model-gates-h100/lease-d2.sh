#!/usr/bin/env bash
# call D2: the last model part, then the GSM8K A/B and the replay gate with gemv_pair in tuned
CALL=d2; source ../2026-12-07-decode-gemv-pair-h100/lease-pre.sh
mkdir -p /tmp/parts && cp .carry/* /tmp/parts/ && ls /tmp/parts
OUT=$OUT bash tools/ci/gpu_pass.sh gsm8k+replay:${GC:-300}; at stages $?
cat $OUT/r/stages.txt 2>/dev/null; tail -25 $OUT/r/gsm8k.log | cut -c1-220; tail -30 $OUT/r/replay.log | cut -c1-220
