"""Edges of the bench's judging code, each on hand-built timings whose right verdict is plain
from the numbers: B exactly 2x slower in every round is a slowdown, identical A/A samples are
no difference, an interval must leave the A/A band by its near tail, a baseline side is judged
against a conservative BF16 correction, and every verdict reaches the report's text."""
import math
from dataclasses import asdict

import pytest

from pq2verify import bench_cli
from pq2verify.bench import baseline, report, stats, verdicts
from pq2verify.bench.plan import (Config, PREFILL_M, TARGET_PREFILL_VS_BF16, TARGET_STEP_M1_MS,
                                  TARGET_STEP_SMALL_FLOOR)

F = "tests/test_bench_verdict_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q '{F}::{test}'"


# --- stats: intervals and verdicts --------------------------------------------------------------
def test_b_twice_as_slow_in_every_round_is_slower_and_identical_aa_is_not():
    """t_A = 10, t_B = 20 in each of 9 paired rounds: every per-round ratio t_A / t_B is 0.5, so
    median, min, max and both interval ends are 0.5: 'slower'. A/A with identical samples: every
    ratio is 1, the interval [1, 1] touches the band's edge and does not leave it."""
    t = "test_b_twice_as_slow_in_every_round_is_slower_and_identical_aa_is_not"
    slow = stats.ratio_interval([10.0] * 9, [20.0] * 9)
    assert (slow["median"], slow["lo"], slow["hi"], slow["min"], slow["max"]) == (0.5,) * 5, (slow, repro(t))
    aa = stats.ratio_interval([10.0] * 9, [10.0] * 9)
    assert (aa["lo"], aa["hi"]) == (1.0, 1.0), (aa, repro(t))
    assert stats.verdict(slow, aa) == "slower", repro(t)
    assert stats.verdict(stats.ratio_interval([20.0] * 9, [10.0] * 9), aa) == "faster", repro(t)
    assert stats.verdict(aa) == "within noise", ("an interval [1, 1] is no difference", repro(t))
    assert stats.verdict(aa, aa) == "within noise", repro(t)


def test_the_spread_of_the_rounds_keeps_min_below_max():
    """Rounds whose ratios are 0.5, 1 and 2 (three times each): min 0.5, max 2, median 1."""
    t = "test_the_spread_of_the_rounds_keeps_min_below_max"
    r = stats.ratio_interval([5.0, 10.0, 20.0] * 3, [10.0] * 9)
    assert (r["min"], r["median"], r["max"]) == (0.5, 1.0, 2.0), (r, repro(t))
    assert r["lo"] <= r["median"] <= r["hi"], (r, repro(t))


def test_a_nan_or_missing_round_is_dropped_not_counted():
    """Three rounds of 1.0 and one NaN and one None: the median of the finite three is 1.0,
    n = 3 (a NaN kept would make the median NaN and the interval empty)."""
    t = "test_a_nan_or_missing_round_is_dropped_not_counted"
    ci = stats.bootstrap_median([1.0, math.nan, 1.0, None, 1.0])
    assert ci["n"] == 3 and (ci["median"], ci["lo"], ci["hi"]) == (1.0, 1.0, 1.0), (ci, repro(t))
    assert stats.bootstrap_median([math.nan, None]) is None, repro(t)


def test_the_unpaired_ratio_is_old_over_new():
    """Old run 10 µs every round, new 20 µs: old / new = 0.5 at the median and both ends."""
    t = "test_the_unpaired_ratio_is_old_over_new"
    r = stats.unpaired_ratio([10.0] * 7, [20.0] * 5)
    assert (r["median"], r["lo"], r["hi"], r["n"]) == (0.5, 0.5, 0.5, (7, 5)), (r, repro(t))


@pytest.mark.parametrize("ci,aa,want", [
    # A/A interval wholly above 1 (1.01-1.02): the band is [1, 1.02]; 1.005 overlaps it
    ({"median": 1.006, "lo": 1.005, "hi": 1.008}, {"lo": 1.01, "hi": 1.02}, "within noise"),
    # A/A wholly below 1 (0.98-0.99): the band is [0.98, 1]; 0.995-0.998 overlaps it
    ({"median": 0.996, "lo": 0.995, "hi": 0.998}, {"lo": 0.98, "hi": 0.99}, "within noise"),
    # inside a wide A/A band (0.97-1.06) a 4% gain is noise; without the A/A row it is not
    ({"median": 1.045, "lo": 1.04, "hi": 1.05}, {"lo": 0.97, "hi": 1.06}, "within noise"),
    ({"median": 1.045, "lo": 1.04, "hi": 1.05}, None, "faster"),
    # the median beyond the band but the near tail inside it: not a difference
    ({"median": 1.05, "lo": 0.99, "hi": 1.10}, None, "within noise"),
    ({"median": 0.95, "lo": 0.90, "hi": 1.01}, None, "within noise"),
])
def test_a_verdict_needs_the_near_tail_outside_the_band_holding_one(ci, aa, want):
    t = "test_a_verdict_needs_the_near_tail_outside_the_band_holding_one"
    assert stats.verdict(ci, aa) == want, (ci, aa, repro(t))


def test_drift_either_way_is_flagged_and_the_ratio_is_last_over_first():
    """The control 10 µs first, 12 µs last: ratio 1.2 (slower), flagged; 10 then 9: 0.9, the
    control got faster by 10%, beyond the 5% tolerance too; 10 then 10.2: 2%, not flagged."""
    t = "test_drift_either_way_is_flagged_and_the_ratio_is_last_over_first"
    up = stats.drift([10.0] * 3, [12.0] * 3)
    assert up["ratio"] == pytest.approx(1.2) and up["flagged"], (up, repro(t))
    down = stats.drift([10.0] * 3, [9.0] * 3)
    assert down["ratio"] == pytest.approx(0.9) and down["flagged"], (down, repro(t))
    assert not stats.drift([10.0] * 3, [10.2] * 3)["flagged"], repro(t)


# --- verdicts: the row verdicts, tuned vs legacy, targets --------------------------------------
def test_an_inverted_ratio_swaps_its_tails():
    """Stored a over b: median 2, min 1.5, max 4, interval [1.8, 2.5]. b over a is the reciprocal
    of each: median 0.5, min 1/4, max 1/1.5, interval [1/2.5, 1/1.8] (the low end from the high)."""
    t = "test_an_inverted_ratio_swaps_its_tails"
    row = {"ratios": {"a_over_b": {"median": 2.0, "min": 1.5, "max": 4.0, "lo": 1.8, "hi": 2.5, "n": 9}}}
    r = verdicts.ratio(row, "b", "a")
    assert r["median"] == 0.5 and r["min"] == 0.25 and r["max"] == pytest.approx(1 / 1.5), (r, repro(t))
    assert r["lo"] == pytest.approx(0.4) and r["hi"] == pytest.approx(1 / 1.8), (r, repro(t))


def _legacy_row(b_over_a: dict) -> dict:
    return {"kind": "shape", "key": "shape:x:m1", "shape": "x", "m": 1, "status": "timed",
            "sides": {"a": {"path": "int_gemv"}, "b": {"path": "gemv"}}, "ratios": {"b_over_a": b_over_a}}


def test_a_tuned_path_twice_as_slow_as_legacy_is_slower_outside_noise():
    """gemv (tuned, counterpart int_gemv) at 0.5x of int_gemv, interval [0.48, 0.52]: slower,
    not within noise, and assess's target says NO; at 0.95x with [0.9, 1.1] it is slower but
    the interval includes 1 (within noise)."""
    t = "test_a_tuned_path_twice_as_slow_as_legacy_is_slower_outside_noise"
    slow = _legacy_row({"median": 0.5, "lo": 0.48, "hi": 0.52, "min": 0.47, "max": 0.53, "n": 9})
    p = verdicts.slower_than_legacy([slow], Config())
    assert len(p) == 1 and p[0]["slower"] and not p[0]["within_noise"], (p, repro(t))
    assert p[0]["verdict"].startswith("slower than legacy"), (p, repro(t))
    tg = next(x for x in verdicts.assess({"rows": [slow]}, Config())["targets"]
              if x["target"].startswith("every tuned"))
    assert tg["met"] is False and "gemv vs int_gemv" in tg["gap"], (tg, repro(t))
    near = _legacy_row({"median": 0.95, "lo": 0.9, "hi": 1.1, "min": 0.85, "max": 1.15, "n": 9})
    p = verdicts.slower_than_legacy([near], Config())
    assert p[0]["slower"] and p[0]["within_noise"], (p, repro(t))
    fast = _legacy_row({"median": 2.0, "lo": 1.9, "hi": 2.1, "min": 1.8, "max": 2.2, "n": 9})
    assert not verdicts.slower_than_legacy([fast], Config())[0]["slower"], repro(t)


def test_no_tuned_legacy_pair_is_not_measured_not_met():
    t = "test_no_tuned_legacy_pair_is_not_measured_not_met"
    tg = next(x for x in verdicts.assess({"rows": []}, Config())["targets"] if x["target"].startswith("every tuned"))
    assert tg["met"] is None and tg["gap"] == "not measured in this run", (tg, repro(t))


def _step_row(m: int, ms: float, floor_ms: float, **extra) -> dict:
    return {"kind": "step", "key": f"step:m{m}", "m": m, "status": "timed", "floor_ms": floor_ms,
            "sides": {"b": {"time": {"median": ms}}}, **extra}


def _target(res: dict, name: str) -> dict:
    return next(x for x in verdicts.assess(res, Config())["targets"] if x["target"] == name)


def test_a_step_target_needs_both_the_floor_fraction_and_the_time_limit():
    """M=1: floor 0.5 ms, step 1.0 ms: 50% of the floor < 85%, although 1.0 ms is within the 1.75 ms
    limit: not met. M=2 (no time limit): floor 1 ms, step 10 ms is 10% < 70%: not met; step 1.25
    ms is 80%: met."""
    t = "test_a_step_target_needs_both_the_floor_fraction_and_the_time_limit"
    assert 1.0 <= TARGET_STEP_M1_MS and 0.8 >= TARGET_STEP_SMALL_FLOOR > 0.1
    tg = _target({"rows": [_step_row(1, 1.0, 0.5)]}, "decode step M=1: tuned")
    assert tg["met"] is False and "50.0% < 85% of floor" in tg["gap"], (tg, repro(t))
    tg = _target({"rows": [_step_row(2, 10.0, 1.0)]}, "decode step M=2: tuned")
    assert tg["met"] is False and tg["got"].endswith("= 10.0% of floor 1.000 ms"), (tg, repro(t))
    tg = _target({"rows": [_step_row(2, 1.25, 1.0)]}, "decode step M=2: tuned")
    assert tg["met"] is True, (tg, repro(t))


H100 = {"config": {"env": "cuda", "device": "NVIDIA H100 80GB HBM3 (sm_90)"}}
H200 = {"config": {"env": "cuda", "device": "NVIDIA H200 (sm_90)"}}


def test_the_step_time_limits_are_judged_on_the_h200_only():
    """M=1, floor 2.17 ms (a GPU slower to read than the H200), step 2.4 ms: 2.17 / 2.4 = 90.4% of
    the floor >= 85%. On the H200 the 1.75 ms limit also holds: 2.4 > 1.75, not met, and the
    needed time min(2.17 / 0.85, 1.75) = 1.75 ms is below a 2.18 ms best read: 'below the speed
    of light'. On an H100 that limit is not its own: met by the fraction, the needed time 2.17 /
    0.85 = 2.553 ms, above the read, and the limit named as not judged."""
    t = "test_the_step_time_limits_are_judged_on_the_h200_only"
    row = _step_row(1, 2.4, 2.17, sol={"sol_pdl_all": {"time": {"median": 2.18}, "pct_floor": 2.17 / 2.18}},
                    sol_best="sol_pdl_all")
    on200 = _target({"header": H200, "rows": [row]}, "decode step M=1: tuned")
    assert on200["met"] is False and "2.400 ms > 1.75 ms" in on200["gap"], (on200, repro(t))
    assert on200["needed_ms"] == pytest.approx(1.75) and "below the speed of light" in on200["gap"], (on200, repro(t))
    on100 = _target({"header": H100, "rows": [row]}, "decode step M=1: tuned")
    assert on100["met"] is True and on100["needed_ms"] == pytest.approx(2.17 / 0.85), (on100, repro(t))
    assert "below the speed of light" not in on100["gap"], (on100, repro(t))
    assert "1.75 ms limit is the H200's, not judged on NVIDIA H100" in on100["gap"], (on100, repro(t))
    assert on100["want"] == ">= 85% of floor (<= 1.75 ms on the H200 only)", (on100, repro(t))
    # a run without a GPU's name (a dry run, an old file) keeps the H200's limits
    assert _target({"rows": [row]}, "decode step M=1: tuned")["met"] is False, repro(t)


def test_the_targets_heading_names_the_runs_gpu_where_it_differs():
    t = "test_the_targets_heading_names_the_runs_gpu_where_it_differs"
    assert report.targets_scope({"header": H200}) == "H200", repro(t)
    assert report.targets_scope({"header": H100}) == "set for the H200; this run: NVIDIA H100 80GB HBM3 (sm_90)", repro(t)
    dry = {"config": {"env": "dry-run", "device": "none (dry run)"}}
    assert report.targets_scope({"header": dry}) == "H200", repro(t)
    text = report.markdown({"header": H100, "rows": [], "config": asdict(Config()), "targets": []}, None)
    assert "## Targets (set for the H200; this run: NVIDIA H100 80GB HBM3 (sm_90))" in text, repro(t)


def test_a_step_slower_than_bf16_misses_the_bf16_target():
    """M=1 step 2 ms, BF16 step 1.8 ms: 0.9x the BF16 speed, far from the 8x wanted."""
    t = "test_a_step_slower_than_bf16_misses_the_bf16_target"
    row = _step_row(1, 2.0, 1.9, ratios={"b_over_bf16": {"median": 0.9, "lo": 0.89, "hi": 0.91}})
    row["sides"]["bf16"] = {"time": {"median": 1.8}}
    tg = next(x for x in verdicts.assess({"rows": [row]}, Config())["targets"] if "than the BF16 step" in x["target"])
    assert tg["met"] is False and tg["got"].startswith("0.90x"), (tg, repro(t))


def _aa(lo, hi, rounds=None):
    return {"kind": "aa", "key": "aa", "status": "timed", "ratios": {"a2_over_a": {"median": 1.0, "lo": lo, "hi": hi}},
            "sides": {"a": {"rounds": rounds or [10.0] * 7}}}


def test_a_row_verdict_is_read_against_the_runs_aa_band():
    """A/A band [0.97, 1.06]: a B 4% faster with interval [1.03, 1.05] is within noise (against
    1 alone it would be faster), and the noise floor judge returns is the A/A interval."""
    t = "test_a_row_verdict_is_read_against_the_runs_aa_band"
    row = {"kind": "shape", "key": "shape:x:m1", "status": "timed", "sides": {},
           "ratios": {"b_over_a": {"median": 1.04, "lo": 1.03, "hi": 1.05}}}
    j = verdicts.judge({"rows": [_aa(0.97, 1.06), row]})
    assert row["verdict"] == "within noise", (row["verdict"], repro(t))
    assert j["noise"] == {"median": 1.0, "lo": 0.97, "hi": 1.06}, (j["noise"], repro(t))


def test_an_interval_reaching_past_the_streaming_time_by_its_far_tail_is_not_suspicious():
    """Streaming 4 MB at 4000 GB/s takes 1 µs; rounds of 0.95, 1.0 and 1.05 µs give ratios
    1.053, 1, 0.952: the median is 1 and the low end below 1, inside the band [0.99, 1.01]:
    nothing is faster than its bytes allow, though the high end (1.053) is above the band."""
    t = "test_an_interval_reaching_past_the_streaming_time_by_its_far_tail_is_not_suspicious"
    row = {"kind": "shape", "key": "shape:x:m1", "status": "timed", "ratios": {},
           "sides": {"b": {"path": "q", "bytes": 4_000_000, "rounds": [0.95, 1.0, 1.05] * 3}}}
    j = verdicts.judge({"rows": [_aa(0.99, 1.01), row], "stream_read_gbps": 4000.0})
    assert not j["suspicious"], (j["suspicious"], repro(t))


def test_flagged_drift_is_listed_and_unflagged_is_not_and_the_run_bracket_reads_first_and_last():
    """A row whose control drifted (flagged) is listed, one whose did not is not; the A/A control
    at 10 µs first ('aa') and 12 µs last ('aa:last') is a run drift of 1.2x, flagged."""
    t = "test_flagged_drift_is_listed_and_unflagged_is_not_and_the_run_bracket_reads_first_and_last"
    drifted = {"kind": "shape", "key": "shape:d:m1", "status": "timed", "sides": {},
               "timing": {"control": "a", "drift": stats.drift([10.0] * 3, [12.0] * 3)}}
    steady = {"kind": "shape", "key": "shape:s:m1", "status": "timed", "sides": {},
              "timing": {"control": "a", "drift": stats.drift([10.0] * 3, [10.1] * 3)}}
    last = {**_aa(0.99, 1.01, [12.0] * 7), "key": "aa:last"}
    j = verdicts.judge({"rows": [_aa(0.99, 1.01), drifted, steady, last]})
    assert len(j["drift"]) == 2 and j["drift"][0].startswith("shape:d:m1: control a 10 -> 12"), (j["drift"], repro(t))
    assert j["drift"][1].startswith("run: the A/A control 10 µs at the start, 12 µs at the end"), (j["drift"], repro(t))
    assert j["run_drift"]["ratio"] == pytest.approx(1.2) and j["run_drift"]["flagged"], (j["run_drift"], repro(t))


# --- baseline: the regression gate --------------------------------------------------------------
HDR = {"config": {"env": "cuda", "device": "H200", "dtype": "bf16", "layout": "prepared"}}


def _run(status="timed", **sides):
    return {"header": HDR, "rows": [{"kind": "shape", "key": "shape:x:m1", "status": status,
                                     "sides": {s: {"rounds": v} for s, v in sides.items()}}]}


def test_the_bf16_correction_is_conservative():
    """B 100 µs stored, 102 µs now (0.9804x, in every round); BF16 100 µs stored, now spread over
    101-103 µs (median 102: the same 0.98x drift). B's ratio over BF16's is 1 at the median, and
    the conservative interval (B lo / BF16 hi, B hi / BF16 lo) straddles 1: within noise, with
    lo <= median <= hi. The other pairing (lo / lo, hi / hi) would put hi below 1: a false
    regression."""
    t = "test_the_bf16_correction_is_conservative"
    spread = [101.0 + 0.25 * i for i in range(9)]
    g = baseline.compare(_run(b=[102.0] * 9, bf16=spread), _run(b=[100.0] * 9, bf16=[100.0] * 9))
    e = next(x for x in g["rows"] if x["side"] == "b")
    ci = e["speedup"]
    assert ci["median"] == pytest.approx(1.0), (ci, repro(t))
    assert ci["lo"] <= ci["median"] <= ci["hi"] and ci["lo"] < 1 < ci["hi"], (ci, repro(t))
    assert not g["regressions"] and e["verdict"] == "within noise", (g["regressions"], repro(t))


def test_a_side_slower_on_a_suspect_row_is_still_a_regression():
    """A row whose check after timing failed ('suspect') is still timed: B 10 µs stored, 20 µs now
    is old / new = 0.5, a regression, and the row is not 'missing'."""
    t = "test_a_side_slower_on_a_suspect_row_is_still_a_regression"
    g = baseline.compare(_run("suspect", b=[20.0] * 9), _run(b=[10.0] * 9))
    assert len(g["regressions"]) == 1 and not g["missing"], (g, repro(t))
    assert g["regressions"][0].startswith("shape:x:m1 b: 0.500x"), (g["regressions"], repro(t))


# --- the run's verdict and the report's text ---------------------------------------------------
def _res(**kw):
    return {"blocked": [], "errors": [], "not_run": [], **kw}


def test_each_failing_count_alone_fails_the_run():
    t = "test_each_failing_count_alone_fails_the_run"
    assert bench_cli.verdict(_res())[0] == "OK", repro(t)
    for kw in ({"blocked": ["k"]}, {"errors": ["k"]}, {"suspect": ["k x"]}, {"suspicious": ["k b p: 2x"]},
               {"baseline": {"regressions": ["k b: 0.5x"]}}):
        assert bench_cli.verdict(_res(**kw))[0] == "FAIL", (kw, repro(t))
    assert bench_cli.verdict(_res(not_run=["k"]))[0] == "PARTIAL", repro(t)


def test_the_report_cells_say_what_failed():
    t = "test_the_report_cells_say_what_failed"
    row = {"verdict": "faster", "check_failures": ["moved"], "sides": {"b": {"suspicious": "2x", "gate": "PASS"},
                                                                      "a": {"gate": "BLOCKED"}}}
    assert report.verdict_cell(row) == "faster SUSPICIOUS b CHECK FAILED", (report.verdict_cell(row), repro(t))
    assert report.gate_cell(row) == "BLOCKED a", repro(t)
    assert report.gate_cell({"sides": {"a": {"gate": "PASS"}}}) == "PASS", repro(t)
    assert [report.met_cell(v) for v in (True, False, None)] == ["yes", "NO", "not measured"], repro(t)
    assert report.ratio_cell({"median": 0.5, "lo": 0.48, "hi": 0.52}) == "0.50x [0.48-0.52]", repro(t)


def test_the_summary_prints_regressions_slower_pairs_and_drift():
    t = "test_the_summary_prints_regressions_slower_pairs_and_drift"
    sp = {"median": 0.5, "lo": 0.48, "hi": 0.52}
    res = {"rows": [], "tuned_vs_legacy": [
               {"tuned": "gemv", "legacy": "int_gemv", "shape": "x", "m": 1, "speedup": sp, "slower": True,
                "within_noise": False},
               {"tuned": "single", "legacy": "int_gemv", "shape": "y", "m": 1, "speedup": {**sp, "median": 2.0},
                "slower": False, "within_noise": False}],
           "run_drift": {"ratio": 1.2, "flagged": True},
           "baseline": {"file": "b.json", "tol": 0.0, "rows": [1], "regressions": ["shape:x:m1 b: 0.500x"],
                        "missing": []}}
    text = "\n".join(report.summary_lines(res))
    assert "REGRESSION shape:x:m1 b: 0.500x" in text, (text, repro(t))
    assert "gemv vs int_gemv at x M=1: 0.50x [0.48-0.52] -> slower than legacy" in text, (text, repro(t))
    assert "single vs int_gemv" not in text, (text, repro(t))
    assert "run drift bracket (A/A control first and last): 1.200x DRIFT beyond the tolerance" in text, (text, repro(t))
    res["run_drift"]["flagged"] = False
    assert "DRIFT beyond" not in "\n".join(report.summary_lines(res)), repro(t)


def test_a_nan_round_never_turns_a_slowdown_into_noise():
    """The stored run 10 µs in every round, this run 20 µs with one NaN round (a failed read):
    the NaN is dropped and the rest is old / new = 0.5, a regression; a NaN in the drift bracket
    is dropped too (10 -> 12 µs: 1.2x, flagged); a NaN round's ratio is not the min or max."""
    t = "test_a_nan_round_never_turns_a_slowdown_into_noise"
    r = stats.unpaired_ratio([10.0] * 9, [20.0] * 8 + [math.nan])
    assert (r["median"], r["lo"], r["hi"], r["n"]) == (0.5, 0.5, 0.5, (9, 8)), (r, repro(t))
    g = baseline.compare(_run(b=[20.0] * 8 + [math.nan]), _run(b=[10.0] * 9))
    assert len(g["regressions"]) == 1, (g, repro(t))
    d = stats.drift([10.0, math.nan, 10.0], [12.0, 12.0, math.nan])
    assert d["ratio"] == pytest.approx(1.2) and d["flagged"], (d, repro(t))
    p = stats.ratio_interval([10.0] * 8 + [math.nan], [20.0] * 9)
    assert (p["min"], p["max"], p["n"]) == (0.5, 0.5, 8), (p, repro(t))


# --- closed by a second round of planted faults (each names the mutant it kills) -------------
def test_a_round_with_a_zero_time_is_dropped_from_the_ratio():
    """Rounds (10, 5), (10, 0), (10, 5): the zero time has no ratio (10 / 0) and is dropped, the
    other two give 2.0: median 2.0 over n = 2. Kills bench/stats.py `b > 0` -> `b >= 0` (10 / 0
    then raises)."""
    t = "test_a_round_with_a_zero_time_is_dropped_from_the_ratio"
    r = stats.ratio_interval([10.0] * 3, [5.0, 0.0, 5.0])
    assert r["n"] == 2 and (r["median"], r["lo"], r["hi"]) == (2.0, 2.0, 2.0), (r, repro(t))


def _prefill_row(us: float, bf16_us: float) -> dict:
    return {"kind": "shape", "key": f"shape:x:m{PREFILL_M}", "shape": "x", "m": PREFILL_M, "status": "timed",
            "sides": {"a": {"path": "mmq"}, "b": {"path": "mmq_wgmma", "time": {"median": us}, "tops": 50.0},
                      "bf16": {"time": {"median": bf16_us}}},
            "ratios": {"b_over_bf16": {"median": bf16_us / us}}}


@pytest.mark.parametrize("us, met", [(100.0, True), (120.0, True), (150.0, False)])
def test_the_prefill_target_is_met_at_or_above_its_speedup_over_bf16(us, met):
    """BF16 at 150 µs; the target is >= 1.25x, so at most 150 / 1.25 = 120 µs: 100 µs (1.5x) and
    120 µs (exactly 1.25x) meet it, 150 µs (1.0x) does not, and its gap names the 120 µs needed.
    Kills bench/verdicts.py `sp["median"] >= TARGET_PREFILL_VS_BF16` -> `<=`."""
    t = "test_the_prefill_target_is_met_at_or_above_its_speedup_over_bf16"
    assert TARGET_PREFILL_VS_BF16 == 1.25, repro(t)
    tg = _target({"rows": [_prefill_row(us, 150.0)]}, f"prefill M={PREFILL_M} x: mmq_wgmma >= 1.25x cuBLAS BF16")
    assert tg["met"] is met, (tg, repro(t))
    assert tg["gap"] == ("met" if met else "needs <= 120 µs, has 150 µs"), (tg, repro(t))


@pytest.mark.parametrize("lo, suspicious", [(1.01, False), (1.0125, True)])
def test_a_step_faster_than_the_speed_of_light_only_beyond_the_band_is_suspicious(lo, suspicious):
    """A/A band [0.99, 1.01]; B's step over its best speed-of-light read with interval low end
    1.01, exactly the band's top: not beyond the noise, not suspicious; at 1.0125 it is.
    Kills bench/verdicts.py `ci.get("lo", 0) > hi` -> `>=`."""
    t = "test_a_step_faster_than_the_speed_of_light_only_beyond_the_band_is_suspicious"
    row = {"kind": "step", "key": "step:m1", "m": 1, "status": "timed", "sol_best": "sol_pdl_all",
           "sides": {"b": {"path": "gemv", "time": {"median": 1.0}}},
           "ratios": {"b_over_sol_pdl_all": {"median": 1.02, "lo": lo, "hi": 1.03}}}
    j = verdicts.judge({"rows": [_aa(0.99, 1.01), row]})
    assert bool(j["suspicious"]) is suspicious, (j["suspicious"], repro(t))
    assert ("suspicious" in row["sides"]["b"]) is suspicious, (row["sides"]["b"], repro(t))


def test_a_blocked_prefill_row_misses_its_target():
    """A prefill row whose tuned side the gate BLOCKED has no ratio over BF16: the target is not
    met (False, not unmeasured), and the gap says why. Kills bench/verdicts.py `False if
    blocked else None` -> `True if blocked ...`."""
    t = "test_a_blocked_prefill_row_misses_its_target"
    row = _prefill_row(100.0, 150.0)
    row["ratios"] = {}
    row["sides"]["b"].update(gate="BLOCKED", reason="relative RMS vs dense 0.5 > 0.004")
    tg = _target({"rows": [row]}, f"prefill M={PREFILL_M} x: mmq_wgmma >= 1.25x cuBLAS BF16")
    assert tg["met"] is False and tg["gap"] == "BLOCKED: relative RMS vs dense 0.5 > 0.004", (tg, repro(t))


def test_a_zero_time_is_dropped_from_the_unpaired_ratio_and_the_drift():
    """A time of 0 is no sample (_finite keeps x > 0): the control at [0, 10] first and [10, 10]
    last is 10 -> 10, ratio 1.0, not flagged (kept, the first median would be 5: 2x, flagged).
    Kills bench/stats.py `x > 0` -> `x >= 0`."""
    t = "test_a_zero_time_is_dropped_from_the_unpaired_ratio_and_the_drift"
    d = stats.drift([0.0, 10.0], [10.0, 10.0])
    assert (d["first"], d["ratio"], d["flagged"]) == (10.0, 1.0, False), (d, repro(t))
    assert stats.unpaired_ratio([10.0, 0.0], [10.0])["n"] == (1, 1), repro(t)


def test_the_intervals_tails_are_half_the_missing_level_each():
    """A two-sided 95% interval leaves 2.5% in each tail; 90% leaves 5%. Kills bench/stats.py
    `(1 - level) / 2` -> `/ 3`."""
    t = "test_the_intervals_tails_are_half_the_missing_level_each"
    assert stats._q(0.95) == pytest.approx((0.025, 0.975)) and stats._q(0.9) == pytest.approx((0.05, 0.95)), repro(t)


def test_the_unpaired_interval_resamples_every_new_round():
    """Old 10 µs every round, new rounds 5 and 20 µs: a resample of the new run's two rounds has
    median 5 (1/4 of the time), 12.5 (1/2) or 20 (1/4), so old / new is 2, 0.8 or 0.5, and the
    2.5% and 97.5% points of 4000 resamples are 0.5 and 2.0 (each end holds ~1/4). Kills
    bench/stats.py `rng.integers(0, b.size, ...)` -> `(1, b.size, ...)` (never the first
    round: 0.5 at both ends)."""
    t = "test_the_unpaired_interval_resamples_every_new_round"
    r = stats.unpaired_ratio([10.0] * 5, [5.0, 20.0])
    assert (r["median"], r["lo"], r["hi"]) == (0.8, 0.5, 2.0), (r, repro(t))


def test_the_tuned_side_is_where_tuned_is():
    """legacy vs tuned: B; tuned vs legacy: A. Kills bench/verdicts.py `cfg.b == "tuned"` ->
    `!=` (it would name B for tuned vs legacy)."""
    t = "test_the_tuned_side_is_where_tuned_is"
    assert verdicts.tuned_side(Config()) == "b", repro(t)
    assert verdicts.tuned_side(Config(a="tuned", b="legacy")) == "a", repro(t)


def test_an_interval_reaching_1_is_within_noise_as_in_stats_verdict():
    """An interval [0.9, 1.0] or [1.0, 1.1] contains 1, so the tuned path is not shown slower
    beyond noise; stats.verdict reads an interval touching its band the same way. [0.9, 0.999]
    excludes 1."""
    t = "test_an_interval_reaching_1_is_within_noise_as_in_stats_verdict"
    for lo, hi, within in ((0.9, 1.0, True), (1.0, 1.1, True), (0.9, 0.999, False)):
        r = _legacy_row({"median": 0.95 if hi <= 1 else 1.05, "lo": lo, "hi": hi, "min": lo, "max": hi, "n": 9})
        p = verdicts.slower_than_legacy([r], Config())
        assert p[0]["within_noise"] is within, (lo, hi, p, repro(t))
    band = stats.verdict({"lo": 0.9, "hi": 1.0}, None)
    assert band == "within noise", (band, repro(t))


def test_a_tuned_path_exactly_as_fast_as_legacy_is_not_slower():
    """gemv at 1.0x and at 1.5x of int_gemv: not slower, verdict 'faster' (>= 1). Kills
    bench/verdicts.py `sp["median"] >= 1` -> `>= 2` (1.5x would read 'slower than legacy')."""
    t = "test_a_tuned_path_exactly_as_fast_as_legacy_is_not_slower"
    for med in (1.0, 1.5):
        row = _legacy_row({"median": med, "lo": med - 0.1, "hi": med + 0.1, "min": med - 0.2, "max": med + 0.2, "n": 9})
        (p,) = verdicts.slower_than_legacy([row], Config())
        assert not p["slower"] and p["verdict"] == "faster", (p, repro(t))


def test_a_skipped_step_names_why_in_its_target():
    """A step row skipped with a note (not timed): its target is unmeasured (met None) and the gap
    is the note. Kills bench/verdicts.py `status == "skipped"` -> `!=`."""
    t = "test_a_skipped_step_names_why_in_its_target"
    row = {"kind": "step", "key": "step:m2", "m": 2, "status": "skipped", "note": "M=2 is not served", "sides": {}}
    tg = _target({"rows": [row]}, "decode step M=2: tuned")
    assert tg["met"] is None and tg["gap"] == "M=2 is not served", (tg, repro(t))
