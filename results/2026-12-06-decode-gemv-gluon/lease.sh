#!/usr/bin/env bash
# a short lease: gemv's GPU tests (Gluon against its twin, paths, graphs, PDL with a held
# producer), its golden captures, then per-shape and step timing
set -o pipefail
T0=$(date +%s); at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 )) s"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > $OUT/env.txt
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> $OUT/env.txt
timeout 130 python3 -m pytest -q -p no:cacheprovider --device cuda tests/test_gemv_gluon.py tests/test_gemv_ring.py tests/test_paths.py tests/test_graphs.py tests/test_pdl_overlap.py -k "gemv and not int_gemv or test_gemv_gluon or test_gemv_ring" -n 10 -rfE --tb=short > $OUT/check.log 2>&1
at check $?; tail -3 $OUT/check.log | cut -c1-300
timeout 45 python3 -m pq2verify.cli --device cuda golden verify --paths gemv > $OUT/golden.log 2>&1
at golden $?; tail -2 $OUT/golden.log | cut -c1-300
V='{"triton": {"GLUON": false}, "gluon": {"GLUON": true}, "gc4": {"GC": 4, "BN": 32, "num_warps": 4}, "bn32w4gc8": {"BN": 32, "num_warps": 4, "GC": 8}}'
timeout ${TAB:-100} python3 tools/tune/step_ab.py $OUT/ab1.json --m 1 --shapes gate_up,down,in_proj,qkv,out,lm_head --sol --rounds 5 --variants "$V" > $OUT/ab1.log 2>&1
at step_ab $?; grep -v "^ " $OUT/ab1.log | grep -v "SOL read " | sed -E 's/ +/ /g' | cut -c1-100
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader >> $OUT/env.txt
