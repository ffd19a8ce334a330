#!/usr/bin/env bash
# Call B: the planes/fold/MMA split of mmq_wgmma (#28), gemv's stages (#27), then ncu of the decode kernels
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv > $OUT/env-b.txt
D=${DEADLINE:-570}; IS=${ISEC:-170}; SS=${SSEC:-170}
timeout $IS python3 tools/profile/prefill_isolate.py $OUT/isolate.json --m 2048 --rounds 3 --budget-s $(( IS - 45 )) \
  --shapes ${ISHAPES:-gate_up,down,out,in_proj,qkv,lm_head} > $OUT/isolate.log 2>&1
at isolate $?; grep -vE "^ " $OUT/isolate.log | cut -c1-220 | tail -45
timeout $SS python3 tools/profile/decode_boundary.py $OUT/gemv-stages.json --stages --rounds 4 \
  --shapes ${DSHAPES:-gate_up,down,out,in_proj,qkv,lm_head} > $OUT/gemv-stages.log 2>&1
at stages $?; grep -E "stages|bits|streaming|clock" $OUT/gemv-stages.log | cut -c1-260
LEFT=$(( D - ($(date +%s) - T0) ))
[ -z "${SKIP_NCU:-}" ] && SKIP_BENCH=1 DEADLINE=$LEFT bash results/2026-12-07-decode-prefill-causes-h100/lease-ncu.sh
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env-b.txt
