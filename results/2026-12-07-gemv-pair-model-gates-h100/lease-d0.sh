#!/usr/bin/env bash
# call D0: first model part into /tmp/parts, then compute-sanitizer on gemv_pair
CALL=d0; source ../2026-12-07-decode-gemv-pair-h100/lease-pre.sh
mkdir -p /tmp/parts && cp .carry/* /tmp/parts/ && ls /tmp/parts
timeout 150 python3 -m pq2verify.sanitize --paths gemv_pair --out $OUT/sanitize > $OUT/sanitize.log 2>&1
at sanitize $?; tail -12 $OUT/sanitize.log | cut -c1-250
