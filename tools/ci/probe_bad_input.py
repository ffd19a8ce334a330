"""Adversarial bad-input probes against every command and the Python API, each in a fresh
process, classified by what a user would see:

  refused     exit 2 (or the API's ValueError/TypeError/AttributeError), a message, no traceback
  accepted    exit 0 where the input is legitimate (the probe says so)
  FAIL-ok     exit 1 where the probe plants a real failure
  SILENT      exit 0 where the input should have been refused
  TRACEBACK   a Python traceback reached the user
  LOST        an input or an existing output file was changed or removed
  MISLEADING  refused, but the message names none of the words the probe expects
  TIMEOUT     still running after the cap (the input was not refused before the work)

Usage: .venv/bin/python tools/ci/probe_bad_input.py [--markdown F] [--jobs N] [--only WORD]
Exit 1 if any probe is SILENT, TRACEBACK, LOST, MISLEADING or TIMEOUT."""
import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CAP_S = 90
BAD = ("SILENT", "TRACEBACK", "LOST", "MISLEADING", "TIMEOUT")
ONE = ["--paths", "native", "--m", "1", "--dtype", "bf16", "--skip-selfcheck"]   # a short real run


def probes(tmp: Path):
    """(name, argv or ('api', code), env, expect, words, guarded files). expect: 2 refused, 0 accepted,
    1 a real FAIL. words: the message must name one of them (case-insensitive)."""
    f, g = tmp / "f.json", tmp / "g.md"
    sentinel = tmp / "keep.json"
    bad_json, arr_json, empty = tmp / "bad.json", tmp / "arr.json", tmp / "empty.json"
    data_bad = tmp / "data.jsonl"
    emptydir = tmp / "emptydir"
    cap = ROOT / "golden" / "interpreter" / "manifest.json"
    c = ["check"]
    P = []

    def add(name, argv, expect=2, words=(), env=None, guard=()):
        P.append((name, argv, env or {}, expect, words, tuple(guard)))
    # check
    add("check --paths gemv,,single", c + ["--paths", "gemv,,single"], words=["--paths"])
    add("check --paths ' '", c + ["--paths", " "], words=["--paths"])
    add("check --m 0x10", c + ["--m", "0x10"], words=["--m"])
    add("check --m 1e3", c + ["--m", "1e3"], words=["--m"])
    add("check --m 10**20", c + ["--paths", "native", "--m", str(10 ** 20)], words=["--m", "memory", "M"])
    add("check --dtype BF16", c + ["--dtype", "BF16"], words=["--dtype"])
    add("check --layout Raw", c + ["--layout", "Raw"], words=["--layout"])
    add("check --kernels Tuned", c + ["--kernels", "Tuned"], words=["kernel set", "--kernels"])
    add("check --kernels ''", c + ["--kernels", ""], words=["--kernels"])
    add("check --case seed-1", c + ["--case", "gemv:a=200x640:m1:bf16:raw:normal:seed-1"], words=["--case", "seed"])
    add("check --case m0", c + ["--case", "gemv:a=200x640:m0:bf16:raw:normal:seed1"], words=["--case", "M"])
    add("check --case dense layout for gemv", c + ["--case", "gemv:a=200x640:m1:bf16:dense:normal:seed1"],
        words=["layout"])
    add("check --case unknown kind", c + ["--case", "gemv:a=200x640:m1:bf16:raw:spiky:seed1"], words=["kind"])
    add("check --case unknown path", c + ["--case", "nosuch:a=200x640:m1:bf16:raw:normal:seed1"], words=["path"])
    add("check --case wrong size for a", c + ["--case", "gemv:a=201x640:m1:bf16:raw:normal:seed1"],
        words=["shape", "200x640"])
    add("check --case twice", c + ["--case", "native:t=8x128:m1:bf16:raw:normal:seed1"] * 2, words=["--case"])
    add("check --shard 0/2", c + ["--shard", "0/2"], words=["--shard"])
    add("check --shard 3/2", c + ["--shard", "3/2"], words=["--shard"])
    add("check --shard 1/0", c + ["--shard", "1/0"], words=["--shard"])
    add("check --shard a/b", c + ["--shard", "a/b"], words=["--shard"])
    add("check --reruns -1", c + ["--reruns", "-1"], words=["--reruns"])
    add("check --json existing dir", c + ONE + ["--json", str(tmp)], words=["--json", "directory"])
    add("check --json /proc/version", c + ONE + ["--json", "/proc/version"], words=["--json"])
    add("check --json F --markdown F", c + ONE + ["--json", str(f), "--markdown", str(f)], words=["same file"])
    add("check --json F --html ./F", c + ONE + ["--json", str(f), "--html", str(tmp / "." / "f.json")],
        words=["same file"])
    add("check --json ''", c + ONE + ["--json", ""], words=["--json"])
    add("check --json /dev/full", c + ONE + ["--json", "/dev/full"], words=["--json", "write"])
    add("check --render missing", c + ["--render", str(tmp / "missing.json")], words=["--render", "missing", "no such"])
    add("check --render empty file", c + ["--render", str(empty)], words=["--render", "json", "JSON"])
    add("check --render not JSON", c + ["--render", str(bad_json)], words=["--render", "JSON", "json"])
    add("check --render a JSON array", c + ["--render", str(arr_json)], words=["--render"])
    add("check --render F --m 1", c + ["--render", str(sentinel), "--m", "1"], words=["--m", "--render"],
        guard=[sentinel])
    add("check --render F --markdown F", c + ["--render", str(sentinel), "--markdown", str(sentinel)],
        words=["input", "--render"], guard=[sentinel])
    add("check --derive-exact --shard 1/2", c + ["--derive-exact", "--shard", "1/2"], words=["--shard"])
    add("check --derive-exact --paths native", c + ["--derive-exact", "--paths", "native"], words=["--paths", "tuned"])
    add("check --derive-exact --paths ''", c + ["--derive-exact", "--paths", ""], words=["--paths"])
    add("check --derive-exact --json /dev/full", c + ["--derive-exact", "--paths", "gemv", "--json", "/dev/full"],
        words=["--json", "write"])
    add("check --shapes bonsai27b on the CPU", c + ["--shapes", "bonsai27b"], words=["--allow-slow", "hours", "slow"])
    add("check one case (legitimate)", c + ["--case", "native:t=8x128:m1:bf16:raw:normal:seed1", "--reruns", "1"],
        expect=0)
    # golden
    add("golden verify --dir missing", ["golden", "verify", "--dir", str(tmp / "nodir")], words=["--dir", "exist"])
    add("golden verify --case nosuch", ["golden", "verify", "--case", "nosuch"], words=["--case"])
    add("golden verify --paths ,", ["golden", "verify", "--paths", ","], words=["--paths"])
    add("golden verify --json <capture>/manifest.json", ["golden", "verify", "--json", str(cap)],
        words=["input", "capture", "inside"], guard=[cap])
    add("golden verify --kernels nosuch", ["golden", "verify", "--kernels", "nosuch"], words=["--kernels", "kernel set"])
    add("golden capture --paths nosuch", ["golden", "capture", "--paths", "nosuch", "--dir", str(tmp / "cap")],
        words=["--paths"])
    add("golden verify --json F --html F", ["golden", "verify", "--json", str(f), "--html", str(f)],
        words=["same file"])
    add("golden verify --dir a file", ["golden", "verify", "--dir", str(sentinel)], words=["--dir"], guard=[sentinel])
    # selftest
    add("selftest --faults nosuch", ["selftest", "--faults", "nosuch"], words=["--faults"])
    add("selftest --faults ''", ["selftest", "--faults", ""], words=["--faults"])
    add("selftest --paths ''", ["selftest", "--paths", ""], words=["--paths"])
    add("selftest --case nosuch", ["selftest", "--case", "nosuch"], words=["--case"])
    add("selftest --json /dev/full", ["selftest", "--paths", "native", "--json", "/dev/full"], words=["--json", "write"])
    add("selftest --json F --markdown F", ["selftest", "--json", str(f), "--markdown", str(f)], words=["same file"])
    add("selftest --faults host_value on the CPU", ["selftest", "--faults", "host_value"], words=["n/a", "applicable"])
    # replay
    add("replay --a ''", ["replay", "--a", ""], words=["--a"])
    add("replay --a tuned --b tuned", ["replay", "--a", "tuned", "--b", "tuned"], words=["same", "identical", "differ"])
    add("replay --m 0", ["replay", "--m", "0"], words=["--m"])
    add("replay --capture missing", ["replay", "--capture", str(tmp / "nocap")], words=["capture"])
    add("replay --faults nosuch", ["replay", "--faults", "nosuch"], words=["--faults"])
    add("replay --layers ''", ["replay", "--layers", ""], words=["--layers"])
    add("replay --positions -1", ["replay", "--positions", "-1"], words=["--positions"])
    add("replay --json F --markdown F", ["replay", "--json", str(f), "--markdown", str(f)], words=["same file"])
    # gsm8k
    add("gsm8k --a tuned --b tuned", ["gsm8k", "--a", "tuned", "--b", "tuned"], words=["same", "resolve", "differ"])
    add("gsm8k --ids ''", ["gsm8k", "--ids", ""], words=["--ids"])
    add("gsm8k --ids 1-", ["gsm8k", "--ids", "1-"], words=["--ids"])
    add("gsm8k --ids -1", ["gsm8k", "--ids", "-1"], words=["--ids"])
    add("gsm8k --ids 99999999999", ["gsm8k", "--ids", "99999999999"], words=["--ids"])
    add("gsm8k --limit -3", ["gsm8k", "--limit", "-3"], words=["--limit"])
    add("gsm8k --top-k 0", ["gsm8k", "--top-k", "0"], words=["--top-k"])
    add("gsm8k --near-tie -0.1", ["gsm8k", "--near-tie", "-0.1"], words=["--near-tie"])
    add("gsm8k --digits 0", ["gsm8k", "--digits", "0"], words=["--digits"])
    add("gsm8k --digits 99", ["gsm8k", "--digits", "99"], words=["--digits"])
    add("gsm8k --shots -1", ["gsm8k", "--shots", "-1"], words=["--shots"])
    add("gsm8k --data missing", ["gsm8k", "--data", str(tmp / "nodata.jsonl")], words=["--data"])
    add("gsm8k --data malformed rows", ["gsm8k", "--data", str(data_bad)], words=["line", str(data_bad.name)])
    add("gsm8k --out /dev/full", ["gsm8k", "--out", "/dev/full"], words=["--out"])
    add("gsm8k --html <data file>", ["gsm8k", "--data", str(data_bad), "--html", str(data_bad)],
        words=["input", "--data", "line"], guard=[data_bad])
    add("gsm8k --model empty folder", ["gsm8k", "--model", str(emptydir)], words=["--model", "model"])
    add("gsm8k --max-new-tokens 0", ["gsm8k", "--max-new-tokens", "0"], words=["--max-new-tokens"])
    add("gsm8k --batch-size -1", ["gsm8k", "--batch-size", "-1"], words=["--batch-size"])
    add("gsm8k --a nosuch", ["gsm8k", "--a", "nosuch"], words=["--a"])
    add("gsm8k --b 'tuned,gemv=maybe'", ["gsm8k", "--b", "tuned,gemv=maybe"], words=["--b"])
    # bench (dry run on the CPU)
    d = ["bench", "--dry-run"]
    add("bench --a tuned --b tuned", d + ["--a", "tuned", "--b", "tuned"], words=["same", "resolve", "A == B"])
    add("bench --budget-s 0", d + ["--budget-s", "0"], words=["--budget-s"])
    add("bench --budget-s nan", d + ["--budget-s", "nan"], words=["--budget-s"])
    add("bench --rotate-gb 0", d + ["--rotate-gb", "0"], words=["--rotate-gb"])
    add("bench --m ''", d + ["--m", ""], words=["--m"])
    add("bench --shapes nosuch", d + ["--shapes", "nosuch"], words=["--shapes"])
    add("bench --pairs 0", d + ["--pairs", "0"], words=["--pairs"])
    add("bench --json F --report F", d + ["--json", str(f), "--report", str(f)], words=["same file"])
    add("bench --baseline missing", d + ["--baseline", str(tmp / "nobase.json")], words=["--baseline"])
    add("bench --baseline F --json F", d + ["--baseline", str(sentinel), "--json", str(sentinel)],
        words=["input", "--baseline"], guard=[sentinel])
    add("bench --dtype fp32", d + ["--dtype", "fp32"], words=["--dtype"])
    add("bench without a GPU, no --dry-run", ["bench"], words=["GPU", "CUDA", "--dry-run"])
    add("bench --spin-us -1", d + ["--spin-us", "-1"], words=["--spin-us"])
    add("bench --ci-width -0.1", d + ["--ci-width", "-0.1"], words=["--ci-width"])
    # fuzz
    add("fuzz --budget-s 0", ["fuzz", "--budget-s", "0"], words=["--budget-s"])
    add("fuzz --seed -5", ["fuzz", "--seed", "-5"], words=["--seed"])
    add("fuzz --max-cases 0", ["fuzz", "--max-cases", "0"], words=["--max-cases"])
    add("fuzz --paths nosuch", ["fuzz", "--paths", "nosuch"], words=["--paths"])
    add("fuzz --json /dev/full", ["fuzz", "--max-cases", "1", "--json", "/dev/full"], words=["--json", "write"])
    add("fuzz --budget-s inf", ["fuzz", "--budget-s", "inf"], words=["--budget-s"])
    add("fuzz one case (legitimate)", ["fuzz", "--max-cases", "1", "--seed", "3", "--paths", "native"], expect=0)
    # environment and top level
    add("PQ2_KERNELS=''", c + ONE, env={"PQ2_KERNELS": ""}, words=["PQ2_KERNELS"])
    add("PQ2_KERNELS=Tuned", c + ONE, env={"PQ2_KERNELS": "Tuned"}, words=["PQ2_KERNELS"])
    add("PQ2_PATH_GEMV=maybe", c + ONE, env={"PQ2_PATH_GEMV": "maybe"}, words=["PQ2_PATH_GEMV"])
    add("PQ2_PATH_NOSUCH=on", c + ONE, env={"PQ2_PATH_NOSUCH": "on"}, words=["PQ2_PATH_NOSUCH"])
    add("PQ2_FOO=1", c + ONE, env={"PQ2_FOO": "1"}, words=["PQ2_FOO"])
    add("PQ2_PATH_GEMV_=off", c + ONE, env={"PQ2_PATH_GEMV_": "off"}, words=["PQ2_PATH_GEMV_"])
    add("--device gpu", ["--device", "gpu", "check"], words=["--device"])
    add("--device cuda without a GPU", ["--device", "cuda", "check"], words=["cuda", "GPU"])
    add("--list-cases nosuch", ["--list-cases", "nosuch"], words=["profile", "--list-cases"])
    add("--list-cases check --list-paths", ["--list-cases", "check", "--list-paths"], words=["--list"])
    add("no command", [], words=["command"])
    add("unknown command", ["nosuchcommand"], words=["nosuchcommand", "choice"])
    add("check --help (legitimate)", c + ["--help"], expect=0)
    # the Python API
    api = "import torch; from kernels import dispatch; from kernels.format import PQ2Weight; from pq2verify import inputs\n" \
          "w = inputs.ternary_weight(8, 128, seed=1, layout='prepared')\n"
    for name, code in [
        ("pq2_matmul(float32 x)", "dispatch.pq2_matmul(torch.zeros(1, 128), w)"),
        ("pq2_matmul(kernels='nosuch')", "dispatch.pq2_matmul(torch.zeros(1, 128, dtype=torch.bfloat16), w, kernels='nosuch')"),
        ("pq2_matmul(K mismatch)", "dispatch.pq2_matmul(torch.zeros(1, 256, dtype=torch.bfloat16), w)"),
        ("pq2_matmul(out of the wrong dtype)", "dispatch.pq2_matmul(torch.zeros(1, 128, dtype=torch.bfloat16), w, "
                                              "out=torch.empty(1, 8, dtype=torch.float16))"),
        ("PQ2Weight(data, 64, 256.0)", "PQ2Weight(w.data, 8, 128.0)"),
        ("w.k = 5", "w.k = 5"),
        ("a code-3 weight, first call", "d = w.data.clone(); d[0] = 0xFF; "
                                        "dispatch.pq2_matmul(torch.zeros(1, 128, dtype=torch.bfloat16), "
                                        "PQ2Weight(d, 8, 128, layout='prepared'))"),
        ("PQ2_KERNEL=legacy through the API", "import os; os.environ['PQ2_KERNEL'] = 'legacy'; "
                                              "dispatch.pq2_matmul(torch.zeros(1, 128, dtype=torch.bfloat16), w)"),
    ]:
        P.append((name, ("api", api + code), {}, 2, (), ()))
    # leading batch dimensions are a linear layer's contract: [B, T, K] -> [B, T, N]
    P.append(("pq2_matmul(3-D x) (legitimate)", ("api", api + "assert dispatch.pq2_matmul(torch.zeros(2, 3, 128, "
              "dtype=torch.bfloat16), w).shape == (2, 3, 8)"), {}, 0, (), ()))
    return P


def setup(tmp: Path) -> None:
    (tmp / "keep.json").write_text(json.dumps({"ok": True, "cases": []}))
    (tmp / "bad.json").write_text("{not json")
    (tmp / "arr.json").write_text("[1, 2]")
    (tmp / "empty.json").write_text("")
    (tmp / "data.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n{"answer": "#### 3"}\n')
    (tmp / "emptydir").mkdir()


def digest(p: Path):
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def run_one(probe, tmp: Path) -> dict:
    name, argv, env, expect, words, guard = probe
    before = {str(g): digest(g) for g in guard}
    if isinstance(argv, tuple):
        cmd = [PY, "-c", "import sys\ntry:\n" + "".join(f"    {ln}\n" for ln in argv[1].splitlines())
               + "except (ValueError, TypeError, AttributeError) as e:\n    print(type(e).__name__, e, file=sys.stderr); "
                 "sys.exit(2)\nsys.exit(0)"]
    else:
        cmd = [PY, "-m", "pq2verify.cli", *(["--device", "cpu"] if argv[:1] != ["--device"] else []), *argv]
    e = {**{k: v for k, v in os.environ.items() if not k.startswith("PQ2_")}, **env}
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=CAP_S)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return dict(name=name, outcome="TIMEOUT", rc=None, msg=f"still running after {CAP_S} s")
    msg = (err.strip().splitlines() or out.strip().splitlines() or [""])[-1][:160]
    changed = [g for g, h in before.items() if digest(Path(g)) != h]
    if changed:
        outcome = "LOST"
    elif "Traceback (most recent call last)" in out + err:
        outcome = "TRACEBACK"
    elif rc == expect == 0:
        outcome = "accepted"
    elif rc == expect == 1:
        outcome = "FAIL-ok"
    elif rc == 0:
        outcome = "SILENT"
    elif rc == 2 and expect == 2:
        low = (out + err).lower()
        outcome = "refused" if not words or any(w.lower() in low for w in words) else "MISLEADING"
    else:
        outcome = f"exit {rc}"
    return dict(name=name, outcome=outcome, rc=rc, msg=msg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    ap.add_argument("--jobs", type=int, default=2, help="probes run at once (default 2)")
    ap.add_argument("--only", default=None, help="run only probes whose name contains this")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error("--jobs: expected an integer >= 1")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        setup(tmp)
        todo = [p for p in probes(tmp) if a.only is None or a.only in p[0]]
        if not todo:
            ap.error(f"--only {a.only!r}: selects no probe")
        with cf.ThreadPoolExecutor(a.jobs) as ex:
            res = list(ex.map(lambda p: run_one(p, tmp), todo))
    rows = ["| # | probe | outcome | exit | message (last line) |", "|---|---|---|---|---|"]
    for i, r in enumerate(res, 1):
        rows.append(f"| {i} | `{r['name']}` | {r['outcome']} | {r['rc']} | {r['msg'].replace('|', '/')} |")
    counts = {}
    for r in res:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    text = "\n".join(rows) + f"\n\n{len(res)} probes: {summary}\n"
    print(text)
    if a.markdown:
        Path(a.markdown).write_text(text)
    return 1 if any(r["outcome"] in BAD or r["outcome"].startswith("exit") for r in res) else 0


if __name__ == "__main__":
    sys.exit(main())
