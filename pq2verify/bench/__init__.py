"""Benchmarks gated on passing numerics: the gate, the timing engine and the run plan.

A (path, shape, M, dtype) is timed only after checks.evaluate passed on the very x and weight
that the timing then reads (the rotating weight copies are byte-identical clones of it at other
addresses). Timing follows SPEC §8/§9: CUDA graphs, weights rotated through >= 1 GB of copies,
contestants in alternating order (A B C, C B A, ...) for >= 7 rounds after warm-up, the median
and range of per-round ratios, NVML clocks and power sampled while the GPU works, and the
streaming read bandwidth measured in the same run.

Three environments run the same engine: RealEnv('cuda') gates and times; RealEnv('cpu') gates
on Triton's interpreter and skips the timing with a reason; FakeEnv (dry run) fakes gates and
timings so the table, report, plot and resume are exercised without CUDA.

The package is cut by concern: plan, gate, contestants, timing, probe, sol (speed of light with
the step's call structure, swept over PDL prefetch depths), step (the chained decode step),
envs, items, runner, verdicts; stats (bootstrap intervals, verdicts, drift), checkafter (checks after
timing), resolve (A/B resolution before any work), baseline (regression gate), selftest (planted
timing faults), power (the step's power proxy at serving clocks), launch (eager launch cost). Its namespace re-exports what the CLI, the report and the tests use.
"""
from .plan import (  # noqa: F401
    GB, STEP_COUNTS, STEP_DENSE, STEP_LAYERS, DEFAULT_MS, STEP_MS, REPORT_MS, INTERP_MS, FIT_DIVS, PRESETS,
    M_PRIORITY, MIN_PAIRS, TARGET_STEP_M, TARGET_STEP_M1_FLOOR, TARGET_STEP_M1_MS, TARGET_STEP_M16_MS,
    TARGET_STEP_M1_VS_BF16, TARGET_STEP_SMALL_FLOOR, TARGET_PREFILL_VS_BF16, PREFILL_M, Config, Shape,
    Item, all_shapes, select_shapes, step_shapes, step_chain, step_order, check_chain, order_ms,
    make_plan, pq2_nbytes, dense_nbytes, call_nbytes, copies_needed)
from .gate import (  # noqa: F401
    Gate, gate, bench_case, decode_dense, BaselineInputs, traced_path)
from .contestants import (  # noqa: F401
    Call, Contestant, clone_weight, row_slice, scaled_clone, weight_bytes, rotation, path_contestant,
    weight_copies, contestant_for, bf16_contestant)
from .timing import (  # noqa: F401
    GraphTimer, Sampler, nvml_reader, time_rounds, spread, fit_fixed_bw, round_ratios, measure)
from .probe import (  # noqa: F401
    read_probe, bandwidth_probes)
from .envs import (  # noqa: F401
    RealEnv, FAKE_EFF, FAKE_RATE, FAKE_BW, fake_us, FakeTimer, FakeWeight, FakeInputs, FakeEnv,
    make_env)
from .sol import (  # noqa: F401
    DEPTHS, SOL_LABELS, read_call, launch_options, sol_contestants)
from .step import (  # noqa: F401
    step_parts, gain_log2, exponents, step_weights, step_contestant, run_chain, chain_stats)
from .items import (  # noqa: F401
    run_bandwidth, run_shape, run_aa, run_step, execute)
from .verdicts import (  # noqa: F401
    tuned_side, ratio, slower_than_legacy, assess, judge, noise_floor, sol_best)
from .runner import (  # noqa: F401
    load_jsonl, error_row, prepare, run)
from .resolve import SameSides, preflight  # noqa: F401
from . import baseline, checkafter, launch, power, selftest, stats  # noqa: F401
