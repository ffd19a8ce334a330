#!/usr/bin/env bash
# Call A: the GPU suite on this tree, then the bench's own run with the time left (under $OUT)
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $GPU"
case "$GPU" in *H200*) W=9; TS=${TS:-300};; *) W=6; TS=${TS:-390};; esac
mkdir -p $OUT/r; git log -1 --format=%H > $OUT/r/tree.txt 2>/dev/null
# an H100 needs about 400 s for the suite: below 500 s the splits alone
case "$GPU" in *H200*) [ ${DEADLINE:-570} -lt 350 ] && SKIP_SUITE=1 SPLITS=1;; *) [ ${DEADLINE:-570} -lt 500 ] && SKIP_SUITE=1;; esac
if [ -z "${SKIP_SUITE:-}" ]; then
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$TS; at suite $?
cat $OUT/r/stages.txt; grep -E "passed|failed" $OUT/r/gpusuite.log | tail -2 | cut -c1-300
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20 | cut -c1-300
gzip -f $OUT/r/gpusuite.log
fi
LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - T0) ))
if [ $LEFT -gt 120 ]; then
  case "$GPU" in
    *H200*) [ -n "${SPLITS:-}" ] && { ISEC=$(( LEFT * 55 / 100 )) SSEC=$(( LEFT * 40 / 100 )) SKIP_NCU=1 DEADLINE=$LEFT bash results/2026-12-07-decode-prefill-causes-h100/lease-b.sh; at splits $?; } || { TB=$(( LEFT - 10 )) BUDGET=$(( LEFT - 75 )) SKIP_NCU=1 bash results/2026-12-07-decode-prefill-causes-h100/lease-ncu.sh; at bench $?; } ;;
    # the bench on an H100 exists for this kernel tree: the splits instead
    *) ISEC=$(( LEFT * 55 / 100 )) SSEC=$(( LEFT * 40 / 100 )) SKIP_NCU=1 DEADLINE=$LEFT bash results/2026-12-07-decode-prefill-causes-h100/lease-b.sh; at splits $? ;;
  esac
fi
cd $OUT && tar czf r.tgz r && rm -rf r
