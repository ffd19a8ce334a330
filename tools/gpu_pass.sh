#!/usr/bin/env bash
# One GPU pass on a lent machine (the `device` tool): runs the named stages in order and writes
# every log under $OUT (default ./runs/gpu). Usage: tools/gpu_pass.sh smoke check tests golden ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
pq2() { python3 -m pq2verify.cli --device cuda "$@"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; \
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } 2>&1 | tee "$OUT/env.log"
for stage in "$@"; do
    echo "=== $stage $(date +%T)"
    case $stage in
        smoke) pq2 check --skip-selfcheck --m 1,2,17 --dtype bf16 --layout prepared --reruns 1 --json "$OUT/smoke.json" ;;
        check) pq2 check --json "$OUT/check.json" ;;
        derive) pq2 check --derive-exact ;;
        tests) python3 -m pytest -q -x --device cuda -m "not bench" -p no:cacheprovider --junitxml="$OUT/tests.xml" tests ;;
        golden) pq2 golden capture && pq2 golden verify ;;
        bench) pq2 bench --a legacy --b tuned --quick --json "$OUT/bench.json" --report "$OUT/bench.md" ;;
        *) echo "unknown stage $stage"; exit 2 ;;
    esac 2>&1 | tee "$OUT/$stage.log"
    echo "=== $stage rc=${PIPESTATUS[0]} $(date +%T)"
done
