"""The resource gate: registers, local memory (spills) and shared memory of every config the
choosers return, compiled for sm_90 without a GPU (`python -m pq2verify.sm90 resources` compiles; this
module holds what needs no compiler: the occupancy rules, the recorded table and the verdict,
so tests/test_resource_gate.py can judge planted results in-process).

Occupancy on sm_90 (H100/H200; CUDA's occupancy calculator, cuda_occupancy.h, for compute
capability 9.0), programs (thread blocks) resident per SM, the least of:
- warps: 64 warps per SM, so floor(64 / num_warps);
- blocks: at most 32 per SM;
- registers: a warp's registers are allocated in units of 256, ceil(regs * 32 / 256) * 256;
  the 65536 registers of an SM are four sub-partitions of 16384, each holding whole warps, so
  floor(16384 / per_warp) * 4 warps fit, floor(that / num_warps) programs; 0 if one program
  needs more than the 65536 registers (it cannot launch);
- shared memory: a program takes its static shared memory (the cubin's SHARED, which on sm_90
  includes the 1 KB the system reserves per block) plus the dynamic shared memory the launch
  asks for (Triton's metadata.shared), rounded up to 128 bytes; the SM's 228 KB (the largest
  carveout, 233472 bytes) hold floor(228 KB / that); 0 above 227 KB (232448 bytes) of static
  and dynamic without the reserved 1 KB, the most one block may use.
Checked against measurements: small_mma at 91 registers gives 5 programs of 4 warps (ncu's
theoretical 31%, results/2026-12-01-decode-small-mma-body/README.md), at 134 registers 3
(results/2026-12-01-decode-targets/README.md); mmq_wgmma at 164 registers and 75.8 KB (ncu's
decimal KB) gives 3 (results/2026-12-01-prefill-mmq-wgmma/README.md).
That last one also shows the cubin's 1 KB is the reserved one, counted once: its 75808 dynamic
bytes plus 2 KB would fit only 2 programs in 228 KB.

The recorded table (pq2verify/verified/resources-sm90.json) holds, per compiled
specialization, the programs per SM it was measured at (its `source` says where) or, for the
rest, what the compile gave when the gate was introduced (the baseline). A specialization fails
when it spills (local memory > 0), when its programs per SM drop below the recorded value, or
when it is not recorded at all (a new config must be recorded, or the gate would not see it).
The spills found when the gate was introduced are recorded as known (`known_spill`, with their
bytes): they pass as "OK (known spill)" and fail if they grow; tests/test_resource_gate.py
holds their list closed, so a new spill or a fixed one both need an edit there.
"""
import json
from pathlib import Path

SM90 = dict(regs_per_sm=65536, sub_partitions=4, reg_unit=256, warp_size=32, max_warps=64, max_blocks=32,
            smem_per_sm=228 * 1024, smem_per_block=227 * 1024, reserved_smem=1024, smem_unit=128)
RECORDED = Path(__file__).parent.parent / "verified" / "resources-sm90.json"
REPRO = "TRITON_INTERPRET=0 .venv/bin/python -m pq2verify.sm90 resources"


def _up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(registers: int, shared: int, num_warps: int, static_shared: int = 1024,
              arch: dict = SM90) -> tuple[int, str]:
    """(programs per SM, the limit that binds: warps, blocks, registers or shared) of a
    program of `num_warps` warps at `registers` per thread, `shared` bytes of dynamic and
    `static_shared` bytes of static shared memory (the reserved 1 KB included, as the sm_90
    cubin reports it), by the rules in the module's docstring."""
    if registers < 0 or shared < 0 or static_shared < 0 or num_warps < 1:
        raise ValueError(f"occupancy: expected registers, shared >= 0 and num_warps >= 1, got "
                         f"{registers}, {shared}, {num_warps}")
    a = arch
    per_warp = _up(registers * a["warp_size"], a["reg_unit"])
    if per_warp * num_warps > a["regs_per_sm"]:
        by_regs = 0
    elif per_warp == 0:
        by_regs = a["max_blocks"]
    else:
        warps = (a["regs_per_sm"] // a["sub_partitions"] // per_warp) * a["sub_partitions"]
        by_regs = warps // num_warps
    # the reserved 1 KB counts against the SM but not against a block's 227 KB
    own = static_shared + shared - min(static_shared, a["reserved_smem"])
    block = _up(own + a["reserved_smem"], a["smem_unit"])
    by_smem = 0 if own > a["smem_per_block"] else a["smem_per_sm"] // block
    limits = {"warps": a["max_warps"] // num_warps, "blocks": a["max_blocks"], "registers": by_regs,
              "shared": by_smem}
    bind = min(limits, key=lambda x: (limits[x], ["registers", "shared", "warps", "blocks"].index(x)))
    return limits[bind], bind


def load(path=RECORDED) -> dict:
    """The recorded table: key -> {programs, source, ...}. A missing or damaged file is a
    ValueError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no recorded resource table") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable recorded resource table: {e}") from None
    rows = data.get("specializations") if isinstance(data, dict) else None
    if not isinstance(rows, dict) or not all(isinstance(v, dict) and type(v.get("programs")) is int
                                             for v in rows.values()):
        raise ValueError(f"{path}: expected {{\"specializations\": {{key: {{\"programs\": int, ...}}}}}}")
    return rows


def judge(row: dict, recorded: dict) -> str:
    """The verdict of one compiled specialization (a row with key, local, programs, limit):
    "OK", "OK (known spill ...)" for a spill the table records (`local`, bytes, with its
    `known_spill` reason: found when the gate was introduced, to be fixed, never grown), or why
    it fails."""
    why = []
    rec = recorded.get(row["key"])
    known = 0 if rec is None or not rec.get("known_spill") else rec.get("local", 0)
    if row["local"] > known:
        why.append(f"SPILL ({row['local']} bytes of local memory a thread"
                   + (f", {known} recorded" if known else "") + ")")
    if rec is None:
        why.append("NOT RECORDED (a new config or specialization: record it with --record)")
    elif row["programs"] < rec["programs"]:
        why.append(f"OCCUPANCY {row['programs']} < {rec['programs']} programs per SM recorded ({row['limit']}-bound, "
                   f"{row['registers']} registers)")
    if why:
        return "; ".join(why)
    return f"OK (known spill: {row['local']} bytes, recorded)" if row["local"] else "OK"


def passed(verdict: str) -> bool:
    return verdict.startswith("OK")


def gate(rows: list[dict], recorded: dict) -> list[dict]:
    """rows with `recorded` (the recorded programs per SM, or None) and `verdict` added."""
    out = []
    for r in rows:
        rec = recorded.get(r["key"])
        out.append({**r, "recorded": None if rec is None else rec["programs"], "verdict": judge(r, recorded)})
    return out


def runs(uses: list[str]) -> list[str]:
    """The runs a specialization serves, from its uses' labels: bonsai27b (the bench and the
    check), gsm8k (the GSM8K model, compiled with --model)."""
    return sorted({u.split(":")[0] for u in uses})


def stale(rows: list[dict], recorded: dict, model: bool = False) -> list[str]:
    """Recorded keys of the runs compiled (bonsai27b; gsm8k too with model) that no compiled
    specialization has any more: a chooser changed."""
    want = {k for k, v in recorded.items() if model or "bonsai27b" in v.get("runs", ["bonsai27b"])}
    return sorted(want - {r["key"] for r in rows})


# Occupancies measured on an H200 (ncu): (kernel, a call among the row's uses) -> (programs per
# SM, where). Recorded even where today's compile gives fewer (the gate then fails, as it
# should); the rest of the table is the compile's baseline.
MEASURED = [
    ("mmq_wgmma", "34816x5120 M=2048 bf16 prepared", 3,
     "measured: ncu, gate_up M=2048, 3 programs per SM at 164 registers and 75.8 KB (results/2026-12-01-prefill-mmq-wgmma/README.md)"),
    ("small_mma", "34816x5120 M=16 bf16 prepared", 5,
     "measured: ncu, gate_up M=16, theoretical 31% = 5 blocks of 4 warps at 91 registers "
     "(results/2026-12-01-decode-small-mma-body/README.md)"),
]


def source(row: dict) -> tuple[int, str]:
    """(programs to record, source) of a freshly compiled row: a measured occupancy where one
    applies, else the compile's own value as the baseline."""
    for kernel, use, programs, where in MEASURED:
        if row["kernel"] == kernel and any(u.endswith(" " + use) or u == use for u in row["uses"]):
            return programs, where
    return row["programs"], "baseline: the compile's occupancy when the gate was introduced"


KNOWN_SPILL = ("spilled when the gate was introduced (2026-12-01, Triton 3.6.0): kept so the suite stays "
               "green, reported by `python -m pq2verify.sm90 resources`; fix the config and drop this entry's spill")


def record(rows: list[dict]) -> str:
    """The recorded table's JSON text for rows (one entry per key)."""
    spec = {}
    for r in sorted(rows, key=lambda r: r["key"]):
        programs, where = source(r)
        spec[r["key"]] = dict(programs=programs, source=where, registers=r["registers"], shared=r["shared"],
                              num_warps=r["num_warps"], local=r["local"], runs=runs(r["uses"]))
        if r["local"]:
            spec[r["key"]]["known_spill"] = KNOWN_SPILL
    return json.dumps(dict(arch="sm_90", rules="pq2verify/sm90/resources.py", specializations=spec), indent=1) + "\n"
