"""The GPU workflow (.github/workflows/gpu.yml) and its driver (tools/ci/gpu_pass.sh), on the CPU:
its `unit` stage leaves out tests/test_paths.py because its `check` stage runs the same cases
with the same checks, and every command it runs goes through the driver, which names its stages
right, runs a group side by side and fails when any stage fails. The driver runs here with a
stand-in Python that logs its arguments, so no GPU is needed."""
import inspect
import os
import re
import subprocess
from pathlib import Path

import pytest

from pq2verify import cases, checks, cli

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"
DRIVER = ROOT / "tools" / "ci" / "gpu_pass.sh"


def test_the_check_stage_runs_test_paths_cases_with_its_checks(monkeypatch, capsys, device):
    # test_paths.py on a GPU: checks.cases("bonsai27b"), every check on every case ("fold" only
    # on the CPU); `check` on the H200: the sm90 key's default selection
    suite = checks.cases("bonsai27b")
    table = cases.check_cases("bonsai27b", key="sm90")
    assert suite and [c.id for c in table] == [c.id for c in suite]
    import tests.test_paths as tp
    gpu_checks = set(tp.CHECKS) - {"fold"}
    # what the check command, with its default options, asks evaluate for on a case (stand-ins
    # for the inputs and the evaluation: no kernel runs)
    default = inspect.signature(checks.evaluate).parameters
    seen = []
    monkeypatch.setattr(checks, "Inputs", lambda c, dev: "inputs")
    monkeypatch.setattr(checks, "evaluate", lambda c, dev, **kw: seen.append(kw) or checks.Result(c))
    assert cli.main(["--device", device, "check", "--case", suite[0].id, "--skip-selfcheck"]) == 0
    assert len(seen) == 1
    asked = set(seen[0].get("checks", default["checks"].default))
    assert gpu_checks <= asked, f"check leaves out {gpu_checks - asked}, which test_paths.py judges on a GPU"
    assert seen[0].get("reruns", default["reruns"].default) >= default["reruns"].default


def _workflow_runs() -> list[str]:
    runs = re.findall(r"^\s+run: (.+)$", WORKFLOW.read_text(), re.M)
    assert runs, "no run: lines in the workflow"
    return runs


def test_every_workflow_command_goes_through_the_driver():
    for cmd in _workflow_runs():
        assert cmd == "./pq2 >/dev/null" or "bash tools/ci/gpu_pass.sh " in cmd, cmd


def _driver(tmp_path, *specs, env=None):
    log = tmp_path / "argv.log"
    py = tmp_path / "py"
    # the stand-in Python: logs each call; NAME=rc in FAIL makes a call whose argv holds NAME fail
    py.write_text('#!/bin/sh\necho "$*" >>"$ARGV_LOG"\n'
                  'for f in $FAIL; do case "$*" in *"$f"*) exit 3 ;; esac; done\nexit 0\n')
    py.chmod(0o755)
    out = tmp_path / "out"
    e = {**os.environ, "PY": str(py), "OUT": str(out), "ARGV_LOG": str(log), "FAIL": "", **(env or {})}
    p = subprocess.run(["bash", str(DRIVER), *specs], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=120)
    stages = (out / "r" / "stages.txt").read_text() if (out / "r" / "stages.txt").exists() else ""
    calls = log.read_text().splitlines() if log.exists() else []
    return p, stages, calls


def test_the_workflow_stages_all_exist_and_run(tmp_path):
    specs = [s for cmd in _workflow_runs() if "gpu_pass.sh" in cmd
             for s in re.findall(r"gpu_pass\.sh (.+)$", cmd)[0].replace('"', "").split()]
    assert any("+" in s for s in specs), "the workflow runs no stages side by side"
    p, stages, calls = _driver(tmp_path, *specs)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    names = [n for s in specs for n in s.split(":")[0].split("+")]
    for n in names:
        assert re.search(rf"^{n} rc=0 \d+ s$", stages, re.M), f"stage {n} not run or failed:\n{stages}"
    # the unit stage is the suite less test_paths.py, and check runs as four shards plus their table
    unit = [c for c in calls if "-m pytest" in c and "not bench" in c]
    assert len(unit) == 1 and "--ignore=tests/test_paths.py" in unit[0] and "--device cuda" in unit[0]
    shards = sorted(re.search(r"--shard (\d)/4", c).group(1) for c in calls if "check --shard" in c)
    assert shards == ["1", "2", "3", "4"]
    assert any("check --render" in c for c in calls)


def test_a_group_runs_every_member_and_fails_when_one_fails(tmp_path):
    p, stages, _ = _driver(tmp_path, "selftest+nosuchstage+sanitize:30", "benchselftest:30")
    assert p.returncode == 1
    assert re.search(r"^nosuchstage rc=1 ", stages, re.M)
    for n in ("selftest", "sanitize", "benchselftest"):
        assert re.search(rf"^{n} rc=0 ", stages, re.M), stages
    assert re.search(r"^group selftest\+nosuchstage\+sanitize wall \d+ s", stages, re.M)


@pytest.mark.parametrize("failing", ["selftest", "pq2verify.sanitize"])
def test_a_failing_command_fails_the_driver(tmp_path, failing):
    p, stages, _ = _driver(tmp_path, "selftest+sanitize:30", env={"FAIL": failing})
    assert p.returncode == 1
    name = "sanitize" if "sanitize" in failing else failing
    assert re.search(rf"^{name} rc=3 ", stages, re.M), stages


def test_a_pytest_stage_at_its_cap_is_interrupted_so_its_summary_is_written(tmp_path):
    """The stand-in for pytest sleeps past the stage's cap; on SIGINT it writes a summary line (as
    pytest writes its short summary on KeyboardInterrupt), on TERM or KILL it would write
    nothing. The stage must end at its cap with that summary in its log."""
    py = tmp_path / "py"
    py.write_text('#!/bin/bash\ncase "$*" in *pytest*) ;; *) exit 0 ;; esac\n'
                  'trap \'echo "short test summary info (interrupted)"; kill $!; exit 2\' INT\n'
                  'sleep 30 & wait\n')
    py.chmod(0o755)
    out = tmp_path / "out"
    e = {**os.environ, "PY": str(py), "OUT": str(out)}
    p = subprocess.run(["bash", str(DRIVER), "determinism:2"], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=60)
    log = (out / "r" / "determinism.log").read_text()
    assert "short test summary info (interrupted)" in log, p.stdout[-1000:] + p.stderr[-1000:] + log
    assert re.search(r"^determinism rc=124 \d+ s$", (out / "r" / "stages.txt").read_text(), re.M)
