"""The resource gate: every config the choosers return for the bonsai27b shapes at the bench's
and the check's Ms, compiled for sm_90 without a GPU (`python -m pq2verify.sm90 resources`), once per
specialization; none may spill (beyond the closed list of spills recorded when the gate was
introduced) or run fewer programs per SM than pq2verify/verified/resources-sm90.json records
(measured on the H200 for small_mma and mmq_wgmma, the compile's baseline elsewhere).

The occupancy rules are checked against hand-derived values and the H200's measurements; the
verdict against planted results (a compile result with more registers, a spill, a config not
recorded); the CLI against planted regressions compiled for real. The compiles run in a
subprocess (the suite's interpreter kernels do not compile): 310 specializations, 60-90 s of one
core with a cold Triton cache (the GSM8K model's too with `python -m pq2verify.sm90 resources
--model`, not run here); the planted runs after it hit Triton's cache."""
import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pq2verify import bench, cases, registry
from pq2verify.sm90 import resources

ROOT = Path(__file__).parents[1]
REPRO = resources.REPRO
KB = 1024

# (registers, dynamic shared, num_warps, static shared) -> (programs, binding limit), derived by
# hand from the sm_90 rules (pq2verify/sm90/resources.py): a warp's registers ceil(r * 32 / 256) * 256,
# warps per sub-partition floor(16384 / that), four sub-partitions; a block's shared memory its
# dynamic bytes plus the 1 KB reserved, rounded to 128, into 228 KB.
HAND = [
    # 91 * 32 = 2912 -> 3072; 16384 // 3072 = 5; 20 warps // 4 = 5
    # (ncu: theoretical 31%, results/2026-12-01-decode-small-mma-body/)
    ((91, 8 * KB, 4, KB), (5, "registers")),
    # 134 * 32 = 4288 -> 4352; 16384 // 4352 = 3; 12 // 4 = 3
    # (results/2026-12-01-decode-targets/: down and out, 3 blocks)
    ((134, 8 * KB, 4, KB), (3, "registers")),
    # 164 * 32 = 5248 -> 5376; 3 a sub-partition, 12 // 4 = 3; shared 75808 + 1024 = 76832,
    # 233472 // 76832 = 3 (results/2026-12-01-prefill-mmq-wgmma/: 3 programs per SM, both
    # limits)
    ((164, 75808, 4, KB), (3, "registers")),
    # 255 * 32 = 8160 -> 8192; 2 a sub-partition, 8 warps // 8 = 1
    ((255, 8 * KB, 8, KB), (1, "registers")),
    # 32 registers: 1024 a warp, 64 warps -> 16 programs; shared 100 KB + 1 KB: 233472 // 103424 = 2
    ((32, 100 * KB, 4, KB), (2, "shared")),
    # exactly the 227 KB a block may use: one program; a byte more cannot launch
    ((32, 227 * KB, 4, KB), (1, "shared")),
    ((32, 227 * KB + 1, 4, KB), (0, "shared")),
    # 16 registers, 4 warps: registers allow 128 // 4 = 32, warps 64 // 4 = 16
    ((16, 0, 4, KB), (16, "warps")),
    # one warp: 64 warps would fit, 32 blocks is the cap
    ((16, 0, 1, KB), (32, "blocks")),
    # 16 warps of 255 registers need 131072 registers, more than an SM has: cannot launch
    ((255, 0, 16, KB), (0, "registers")),
    # no registers at all: the register file binds nothing (32, the block cap; the tie goes to
    # registers, the first in the order of precedence)
    ((0, 0, 1, KB), (32, "registers")),
    # 4 KB of static shared memory holds the reserved 1 KB once: 4096 + 75000 = 79096 -> 79104,
    # 233472 // 79104 = 2 (counting only the dynamic bytes and the 1 KB would give 76032: 3)
    ((32, 75000, 4, 4 * KB), (2, "shared")),
    # no static shared memory: the reserved 1 KB is still paid, 76800 + 1024 = 77824 = 233472 / 3
    ((32, 76800, 4, 0), (3, "shared")),
]


@pytest.mark.parametrize("args,want", HAND)
def test_occupancy_by_hand(args, want):
    assert resources.occupancy(*args) == want


def test_the_default_static_shared_memory_is_the_reserved_kilobyte():
    """Without static_shared the cubin's 1 KB is assumed: 76800 dynamic bytes then fill exactly a
    third of the SM (77824 = 233472 / 3); one byte more static would round to 77952 and 2."""
    assert resources.occupancy(32, 76800, 4) == resources.occupancy(32, 76800, 4, KB) == (3, "shared")
    assert resources.occupancy(32, 76800, 4, KB + 1) == (2, "shared")


@pytest.mark.parametrize("args", [(-1, 0, 4), (0, -1, 4), (0, 0, 0), (0, 0, 4, -1)],
                         ids=["registers", "shared", "warps", "static"])
def test_occupancy_refuses_impossible_programs_and_takes_the_zero_edges(args):
    with pytest.raises(ValueError, match="occupancy: expected"):
        resources.occupancy(*args)


def test_occupancy_takes_zero_registers_and_shared_memory():
    assert resources.occupancy(0, 0, 1, 0)[0] == 32      # zero everything, one warp: the block cap


def test_a_spill_is_judged_against_the_recorded_known_spill_only():
    """A 1-byte spill of an unrecorded key is a spill (and unrecorded); a recorded key whose entry
    names a known spill but no byte count allows none."""
    row = {**_row("k", 32), "local": 1}
    v = resources.judge(row, {})
    assert "SPILL (1 bytes" in v and "NOT RECORDED" in v, v
    v = resources.judge(row, {"k": {"programs": row["programs"], "known_spill": "reason"}})
    assert v.startswith("SPILL (1 bytes") and not resources.passed(v), v
    assert resources.judge(row, {"k": {"programs": row["programs"], "known_spill": "reason", "local": 1}}) \
        == "OK (known spill: 1 bytes, recorded)"


def test_a_rows_runs_and_its_recorded_source():
    """runs: the label before the colon of each use. source: the measured occupancy where the
    row's kernel and a use match a MEASURED entry, else the compile's own count."""
    uses = ["bonsai27b:gate_up 34816x5120 M=2048 bf16 prepared", "gsm8k:mlp.down_projx4 576x6144 M=3 bf16 prepared"]
    assert resources.runs(uses) == ["bonsai27b", "gsm8k"]
    wg = {"kernel": "mmq_wgmma", "uses": uses[:1], "programs": 2}
    assert resources.source(wg)[0] == 3 and resources.source(wg)[1].startswith("measured: ncu, gate_up M=2048")
    other = {"kernel": "mmq", "uses": uses[:1], "programs": 2}
    assert resources.source(other) == (2, "baseline: the compile's occupancy when the gate was introduced")


def test_the_measured_occupancies_need_the_reserved_kilobyte_counted_once():
    """mmq_wgmma at 75808 bytes ran 3 programs per SM on the H200: so the 1 KB the cubin reports
    as static shared memory is the reserved one (counted twice, 3 * 77856 > 233472 would allow
    2). Its 161 registers today still allow 3."""
    assert resources.occupancy(161, 75808, 4, 1024) == (3, "registers")
    assert 3 * (75808 + 2 * KB) > 228 * KB >= 3 * (75808 + KB)


def _row(key, registers, local=0, warps=4, shared=8 * KB):
    programs, limit = resources.occupancy(registers, shared, warps, KB)
    return dict(key=key, registers=registers, local=local, programs=programs, limit=limit)


def _table() -> dict:
    return resources.load()


def _measured(kernel: str) -> str:
    keys = [k for k, v in _table().items() if k.startswith(kernel + " ") and v["source"].startswith("measured")]
    assert len(keys) == 1, f"{kernel}: expected one measured entry in {resources.RECORDED}, got {keys}"
    return keys[0]


def test_the_table_records_the_h200_measurements():
    """The measured occupancies are the floors: mmq_wgmma 3 programs per SM at gate_up M = 2048
    (results/2026-12-01-prefill-mmq-wgmma/), small_mma 5 blocks of 4 warps at gate_up M = 16
    (results/2026-12-01-decode-small-mma-body/)."""
    t = _table()
    w, s = _measured("mmq_wgmma"), _measured("small_mma")
    assert w.startswith("mmq_wgmma BM=128 BN=64 GROUP_M=0 num_stages=4 num_warps=4 | bf16 prepared") and t[w]["programs"] == 3
    assert "BN=128" in s and "num_warps=4" in s and "bf16 prepared" in s and t[s]["programs"] == 5
    assert all(v["programs"] >= 0 and v["source"].split(":")[0] in ("measured", "baseline") for v in t.values())
    # recorded with --model: the GSM8K model's specializations are there too (this test
    # compiles only the bonsai27b ones; `python -m pq2verify.sm90 resources --model` judges both)
    assert {r for v in t.values() for r in v["runs"]} == {"bonsai27b", "gsm8k"}


def test_planted_compile_results_fail_the_verdict():
    """A recorded specialization compiled with more registers (programs per SM down), with a
    spill, a known spill that grew, and a key the table lacks: each fails, naming why."""
    t = _table()
    w = _measured("mmq_wgmma")
    assert resources.judge(_row(w, 161, shared=75808), t) == "OK"
    # 172 registers: 5504 -> 5632 a warp, 2 a sub-partition, 8 warps: 2 programs < 3
    v = resources.judge(_row(w, 172, shared=75808), t)
    assert v.startswith("OCCUPANCY 2 < 3") and not resources.passed(v), v
    v = resources.judge(_row(w, 161, local=16, shared=75808), t)
    assert v.startswith("SPILL (16 bytes") and not resources.passed(v), v
    known = next(k for k, x in t.items() if x.get("known_spill"))
    b = t[known]["local"]
    assert resources.passed(resources.judge(_row(known, 255, local=b, warps=t[known]["num_warps"]), t))
    assert resources.judge(_row(known, 255, local=b + 8, warps=t[known]["num_warps"]), t).startswith("SPILL")
    assert resources.judge(_row("gemv BN=4096 | new", 40), t).startswith("NOT RECORDED")


def test_a_damaged_table_is_refused(tmp_path):
    for text, why in (("{", "unreadable"), ('{"specializations": {"k": {"programs": "3"}}}', "expected")):
        f = tmp_path / "t.json"
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            resources.load(f)
    with pytest.raises(ValueError, match="no recorded"):
        resources.load(tmp_path / "missing.json")


def _sm90(*args: str, code: str | None = None) -> tuple[int, list[dict], str]:
    """(exit, rows, stderr) of `python -m pq2verify.sm90 resources --json ARGS`, or of python -c code run
    with those arguments in sys.argv (a planted compile result)."""
    argv = ["resources", "--json", *args]
    cmd = [sys.executable, "-m", "pq2verify.sm90", *argv] if code is None else [sys.executable, "-c", code, *argv]
    env = {**os.environ, "TRITON_INTERPRET": "0"}      # the interpreter's kernels do not compile
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1) and r.stdout.strip(), f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r.returncode, json.loads(r.stdout), r.stderr


@functools.cache
def _report() -> tuple[int, list[dict]]:
    rc, rows, _ = _sm90()
    return rc, rows


# Triton paths (the library one has no kernel of ours to compile)
KERNEL_PATHS = [p.name for p in registry.PATHS if not p.library]
MS = sorted(set(bench.STEP_MS) | set(bench.DEFAULT_MS) | set(bench.REPORT_MS) | set(cases.MS["bonsai27b"]))
# The spills the compile gave when the gate was introduced (Triton 3.6.0), recorded as known:
# (path, config fields that identify it, layout). Closed: a new spill, or a fixed one, is an
# edit here and a re-record.
KNOWN_SPILLS = {
    ("native", (("BM", 128), ("BN", 128), ("num_stages", 3), ("num_warps", 8)), "raw"),          # M = 128
    ("mmq_planes", (("BM", 64), ("BN", 128), ("SWAP", True), ("num_stages", 3), ("num_warps", 4)), "prepared"),
    ("gemv", (("ACT_FIRST", False), ("BN", 64), ("DEPTH", 1), ("GC", 16), ("PDL", True), ("SPLIT", 1),
              ("groups_per_split", 40), ("num_warps", 8)), "raw"),                                                                                       # in_proj, qkv
}


def _expected() -> set[tuple]:
    """(path, config, N, K, M, dtype, layout) of every call the bench and the check make on the
    bonsai27b shapes, from the choosers themselves."""
    out = set()
    for name in KERNEL_PATHS:
        p = registry.get(name)
        mod = importlib.import_module(p.module)
        for _, n, k in cases.SHAPES["bonsai27b"][p.weight]:
            for m in MS:
                if p.serves(m):
                    cfg = tuple(sorted(mod.config(n, k, m, interpret=False).items()))
                    out |= {(name, cfg, n, k, m, dt, lay) for dt in ("bf16", "fp16") for lay in p.layouts}
    return out


def _got(rows) -> set[tuple]:
    out = set()
    for r in rows:
        for u in r["uses"]:
            _, nk, m, dt, lay = u.split()
            n, k = nk.split("x")
            cfg = {f: v for f, v in r["config"].items() if not (r["kernel"] == "mmq_wgmma" and f == "num_warps")}
            out.add((r["kernel"], tuple(sorted(cfg.items())), int(n), int(k), int(m[2:]), dt, lay))
    return out


def test_every_chooser_config_passes_the_gate():
    """Each specialization compiled: no spill beyond the known ones, programs per SM at least
    the recorded value, every one recorded and no recorded one gone."""
    rc, rows = _report()
    bad = [r for r in rows if not resources.passed(r["verdict"])]
    assert not bad, (f"{len(bad)} specializations fail the resource gate, e.g. {bad[0]['key']}: {bad[0]['verdict']} "
                     f"(uses {bad[0]['uses'][:2]}); reproduce: {REPRO}")
    assert rc == 0
    gone = resources.stale(rows, _table())
    assert not gone, (f"recorded specializations no chooser config compiles any more: {gone[:3]}; re-record: "
                      f"{REPRO} --record {resources.RECORDED.relative_to(ROOT)}")
    assert len({r["key"] for r in rows}) == len(rows), "two specializations share a key"
    assert len(rows) < 400, f"{len(rows)} compiles: the deduplication by specialization failed"


def test_every_call_of_the_runs_is_compiled():
    """The compiled rows' uses are exactly the calls the choosers serve on the bonsai27b shapes
    at the bench's and the check's Ms, every Triton path of the registry included."""
    _, rows = _report()
    want, got = _expected(), _got(rows)
    assert want == got, (f"calls not compiled: {sorted(want - got)[:3]}; compiled but not expected: "
                         f"{sorted(got - want)[:3]}; reproduce: {REPRO}")
    assert {r["kernel"] for r in rows} == set(KERNEL_PATHS)


def test_the_known_spills_are_the_recorded_list():
    _, rows = _report()
    found = {(r["kernel"], tuple(sorted(r["config"].items())), r["variant"].split()[1]) for r in rows if r["local"]}
    want = {(k, tuple(sorted(c)), lay) for k, c, lay in KNOWN_SPILLS}
    assert found == want, (f"spilling configs changed: new {sorted(found - want)}, gone {sorted(want - found)}; "
                           f"reproduce: {REPRO}")


PLANT = """import sys
from pq2verify.sm90 import cli, compiler
real = compiler.resource_usage
def more(kern):
    use = real(kern)
    if kern.metadata.name == "_small_mma_kernel":
        use["registers"] += 40      # what a heavier loop body would need
    return use
compiler.resource_usage = more
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_planted_register_growth_fails():
    """small_mma's compile result with 40 more registers a thread: the same keys, fewer programs
    per SM (91 -> 131: 5 -> 3; 128 -> 168: 4 -> 3; 134 -> 174: 3 -> 2), so every one fails."""
    rc, rows, _ = _sm90("--only", "small_mma", code=PLANT)
    assert rc == 1 and rows
    assert all(r["verdict"].startswith("OCCUPANCY") for r in rows), [r["verdict"] for r in rows if
                                                                       not r["verdict"].startswith("OCCUPANCY")][:3]


def test_a_planted_larger_tile_fails():
    """mmq_wgmma forced to 128-row weight tiles (8 warps): configs the table does not know, so
    the gate fails until they are measured or recorded."""
    rc, rows, _ = _sm90("--only", "mmq_wgmma", "--config", 'mmq_wgmma={"BN": 128}')
    assert rc == 1 and rows and all(r["num_warps"] == 8 for r in rows)
    assert all(r["verdict"].startswith("NOT RECORDED") for r in rows), rows[0]["verdict"]


def test_a_planted_spilling_config_fails():
    """gemv forced to 64 rows x 16 groups, 8 warps on every shape: the raw layout spills where the
    chooser does not pick it (recorded nowhere), a SPILL verdict."""
    rc, rows, _ = _sm90("--only", "gemv", "--config", 'gemv={"GC": 16, "BN": 64, "num_warps": 8}')
    assert rc == 1
    spilled = [r for r in rows if r["local"] and not resources.passed(r["verdict"])]
    assert spilled and all("SPILL" in r["verdict"] for r in spilled), [r["verdict"] for r in rows][:3]


@pytest.mark.parametrize("args,why", [
    (["--only", "bogus"], "argument --only"),
    (["--only", ""], "argument --only"),
    (["--config", "small_mma"], "argument --config"),
    (["--config", "small_mma={"], "argument --config: small_mma: not JSON"),
    (["--config", "small_mma=[1]"], "argument --config: small_mma: expected a JSON object"),
    (["--config", 'small_mma={"BN": 3}'], "argument --config: small_mma: config field BN=3"),
    (["--table", "/nonexistent/table.json"], "argument --table"),
    (["--record", ""], "--record"),
    (["--record", "/tmp/t.json", "--only", "gemv"], "argument --record: records the whole table"),
    (["--config", "gemv={}", "--config", 'gemv={"BN": 64}'], "argument --config: gemv given twice"),
])
def test_bad_options_are_usage_errors(monkeypatch, capsys, args, why):
    """Refused before any compile, exit 2, naming the option (in-process: nothing compiles)."""
    from pq2verify.sm90 import cli, gate
    monkeypatch.setattr(gate, "resources_report", lambda *a, **k: pytest.fail("compiled despite a bad option"))
    with pytest.raises(SystemExit) as e:
        cli.main(["resources", *args])
    assert e.value.code == 2 and why in capsys.readouterr().err
