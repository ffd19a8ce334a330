# sourced by each call: environment and the GPU's state
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=$PWD
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $GPU"
case "$GPU" in *H200*) W=9;; *) W=6;; esac
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv >> $OUT/env-$CALL.txt
git log -1 --format=%H >> $OUT/env-$CALL.txt 2>/dev/null; git status --short | head -12 >> $OUT/env-$CALL.txt
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> $OUT/env-$CALL.txt
