"""tools/profile/gsm8k_profile.py on the CPU with the tiny model: wall time, phases and a cProfile table."""
import subprocess
import sys
from pathlib import Path

import pytest

from test_gsm8k_cli import tiny_model  # noqa: F401  (the module-scoped fixture)

pytest.importorskip("transformers")
TOOL = Path(__file__).resolve().parent.parent / "tools" / "profile" / "gsm8k_profile.py"


def test_profile_tool_prints_wall_phases_and_profile(tiny_model, tmp_path, device):  # noqa: F811
    if device == "cuda":
        pytest.skip("runs the tool with --device cpu; on a GPU run it by hand with --device cuda")
    out = subprocess.run([sys.executable, str(TOOL), "--device", "cpu", "--limit", "2", "--top", "5",
                          "--out", str(tmp_path), "--model", str(tiny_model), "--digits", "2",
                          "--max-new-tokens", "3", "--batch-size", "2", "--threads", "1"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "wall" in text and "cumulative" in text and (tmp_path / "gsm8k.prof").exists()
    for label in ("a", "b", "f"):
        line = next(x for x in text.splitlines() if x.startswith(f"run {label} "))
        assert "decode" in line and "host" in line, line
    assert "teacher:b" in next(x for x in text.splitlines() if x.startswith("run a "))


def test_profile_tool_reports_a_failed_run(tmp_path, device, monkeypatch, capsys):
    """In this process (the imports are warm): the run fails on a missing model, and the tool
    says so with the command to rerun; the thread count and environment it sets are restored."""
    if device == "cuda":
        pytest.skip("runs the tool with --device cpu")
    import importlib.util
    import torch
    spec = importlib.util.spec_from_file_location("gsm8k_profile_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setenv("PQ2VERIFY_PHASE_SYNC", "0")           # the tool sets it; restored after
    threads = torch.get_num_threads()
    try:
        rc = tool.main(["--device", "cpu", "--limit", "2", "--out", str(tmp_path),
                        "--model", str(tmp_path / "missing")])
    finally:
        torch.set_num_threads(threads)
    assert rc != 0 and "rerun:" in capsys.readouterr().err


@pytest.mark.parametrize("args,bad", [(["--top", "0"], "--top 0"), (["--limit", "-1"], "--limit -1"),
                                      (["--jobs", "0"], "--jobs 0"), (["--device", "tpu"], "--device")])
def test_profile_tool_refuses_impossible_options(args, bad, tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), *args, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and bad in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()                  # refused before any work
