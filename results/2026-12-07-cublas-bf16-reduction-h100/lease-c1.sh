#!/usr/bin/env bash
# call: is cuBLAS's bf16 reduced-precision reduction what fails the fuzz case? then the suite
CALL=c1; source .gpu/fin/pre.sh
C1=cublas:t=3x640:m3262:bf16:dense:normal:seed68607; C2=cublas:t=3x640:m3283:bf16:dense:normal:strided:seed68607
ck() { timeout 60 python3 -m pq2verify.cli --device cuda check --skip-selfcheck --case $1 2>&1 | tail -4 | cut -c1-400; }
cp kernels/cublas.py /tmp/cublas_fix.py; cp .gpu/fin/cublas_orig.py kernels/cublas.py
echo "--- torch default (reduced-precision reductions allowed)"; ck $C1; ck $C2
cp /tmp/cublas_fix.py kernels/cublas.py
echo "--- FP32 reductions"; ck $C1; ck $C2
# one row of the case, both settings, against fp64 (what changed)
python3 .gpu/fin/diag_red.py 2>&1 | tail -8
timeout 80 python3 -m pq2verify.cli --device cuda golden verify --paths cublas,small_gemm > $OUT/golden-cublas.log 2>&1; at golden $?; tail -3 $OUT/golden-cublas.log | cut -c1-300
timeout 90 python3 -m pq2verify.cli --device cuda check --derive-exact --record --shapes bonsai27b --paths small_gemm > $OUT/derive-sg.log 2>&1; at derive $?; tail -3 $OUT/derive-sg.log | cut -c1-300; cp pq2verify/verified/exact-sm90.json $OUT/
LEFT=$(( ${END:-520} - ($(date +%s) - T0) )); echo "suite cap $LEFT"
OUT=$OUT WORKERS=$W bash tools/ci/gpu_pass.sh gpusuite:$LEFT; at suite $?
gzip -c $OUT/r/gpusuite.log > $OUT/gpusuite.log.gz; grep -E "passed|failed" $OUT/r/gpusuite.log | tail -2
grep -E "^FAILED|^ERROR" $OUT/r/gpusuite.log | head -20 | cut -c1-300; rm -f $OUT/r/gpusuite.xml $OUT/r/gpusuite.log
