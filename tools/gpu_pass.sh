#!/usr/bin/env bash
# One GPU pass on a lent machine: each stage under its own time cap, logs under $OUT/r, then
# one archive (the device tool brings back at most 8 files). Usage: tools/gpu_pass.sh STAGE:SECONDS ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
R=$OUT/r
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
pq2() { python3 -m pq2verify.cli --device cuda "$@"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } >"$R/env.txt" 2>&1
for spec in "$@"; do
    stage=${spec%%:*}; cap=${spec##*:}
    echo "=== $stage (cap ${cap}s) $(date +%T)"
    case $stage in
        check) timeout "$cap" python3 -m pq2verify.cli --device cuda check --skip-selfcheck --json "$R/check.json" ;;
        derive) timeout "$cap" python3 -m pq2verify.cli --device cuda check --derive-exact --shapes bonsai27b \
                    && cp pq2verify/verified/exact-*.json "$R/" ;;
        golden) timeout "$cap" python3 -m pq2verify.cli --device cuda golden capture \
                    && timeout "$cap" python3 -m pq2verify.cli --device cuda golden verify ;;
        graph) timeout "$cap" python3 -m pytest -q -p no:cacheprovider --device cuda -m "graph or golden" tests ;;
        bench) timeout "$cap" python3 -m pq2verify.cli --device cuda bench --a legacy --b tuned --quick \
                    --budget-s $((cap - 30)) --json "$R/bench.json" --report "$R/bench.md" ;;
        *) echo "unknown stage $stage" ;;
    esac >"$R/$stage.log" 2>&1
    echo "=== $stage rc=$? $(date +%T)"; tail -n 4 "$R/$stage.log"
done
tar czf "$OUT/gpu_pass.tgz" -C "$OUT" r golden 2>/dev/null || tar czf "$OUT/gpu_pass.tgz" -C "$OUT" r
[ -d golden/sm90 ] && tar czf "$OUT/golden_sm90.tgz" golden/sm90
cp "$R/check.log" "$OUT/" 2>/dev/null
true
