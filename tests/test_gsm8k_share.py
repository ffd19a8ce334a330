"""Prefills shared between the runs of one process (generate.PrefillMemo): copied only where the
arithmetic is the same, and then bit for bit what the run computes alone; phase seconds recorded."""
import json
from pathlib import Path

import pytest

from test_gsm8k_cli import cpu_env, cpu_setting, lines, run, tiny_model  # noqa: F401  (fixtures)

pytest.importorskip("transformers")

# B's prefill (M > 16) takes another path than A's (native instead of mmq), its decode the same;
# the floor F then reverses the fold order at the prefill Ms only. So B's and F's teacher-forced
# prefills are their own, and their free runs may copy those but never A's.
SPECS = ("--a", "legacy", "--b", "legacy,mmq=off")


@pytest.fixture(scope="module")
def alone(tiny_model, tmp_path_factory, device):  # noqa: F811
    """--jobs 3: A in this process, B and F each alone in a worker process (nothing shared).
    Only read after: both tests compare their one-process runs with these records."""
    out = tmp_path_factory.mktemp("alone")
    with pytest.MonkeyPatch.context() as mp, cpu_setting(mp, device):
        assert run(tiny_model, out, *SPECS, "--jobs", "3") == 0
    return _records(out)


def _records(out: Path) -> dict:
    rep = json.loads((out / "report.json").read_text())
    return {r["label"]: ({x["id"]: x for x in lines(Path(r["dir"]))}, r) for r in rep["runs"]}


def test_shared_prefills_change_no_bit(tiny_model, alone, tmp_path, cpu_env):  # noqa: F811
    """--jobs 3 (`alone`): B and F each alone in a worker process (nothing shared); --jobs 1: all
    runs in one process, batch by batch, copying prefills. Every record is the same; the copies
    happened."""
    assert run(tiny_model, tmp_path / "shared", *SPECS, "--jobs", "1") == 0
    shared = _records(tmp_path / "shared")
    assert alone.keys() == shared.keys() == {"a", "b", "f"}
    for label in alone:
        (ra, sa), (rs, ss) = alone[label], shared[label]
        assert ra == rs, f"run {label}: records differ with shared prefills"
        assert sa["trace"] == ss["trace"] and sa["m_calls"] == ss["m_calls"]     # copies counted as calls
        assert sa["teacher_trace"] == ss["teacher_trace"]
    assert shared["a"][1]["copied_calls"] == 0 and alone["b"][1]["copied_calls"] == 0
    assert shared["b"][1]["copied_calls"] > 0 and shared["f"][1]["copied_calls"] > 0
    phases = shared["a"][1]["phases"]
    assert {"prefix", "prefill", "decode", "teacher:b", "teacher:f", "host"} <= phases.keys()
    assert all(v >= 0 for v in phases.values())
    assert "seconds per phase" in (tmp_path / "shared" / "report.md").read_text()


def test_a_copy_across_different_arithmetic_is_caught(tiny_model, alone, tmp_path, cpu_env, monkeypatch):  # noqa: F811
    """The check above fails when prefills are shared regardless of the path (every run's
    signature made the same): B then starts from A's mmq prefill instead of its own (and, with
    A's calls credited, B's trace reads like A's: the switch proof trips too, exit 1)."""
    from pq2verify.gsm8k import execute
    monkeypatch.setattr(execute, "signature", lambda spec, fold, dev, dtype: lambda m: ("any", False))
    assert run(tiny_model, tmp_path / "broken", *SPECS, "--jobs", "1") == 1
    broken = _records(tmp_path / "broken")
    assert broken["b"][1]["copied_calls"] > 0
    assert alone["b"][0] != broken["b"][0]


def test_memo_keeps_the_latest_batch_only():
    from collections import Counter
    from pq2verify.gsm8k.generate import PrefillMemo
    memo = PrefillMemo()
    memo.put(("prefix", (1, 2), (2,), "s"), {"c": 1}, None, Counter())
    memo.put(("batch", "b1", (2, 20), "s", "t"), {"c": 2}, "logits", Counter({("mmq", 20): 3}))
    memo.put(("batch", "b2", (2, 30), "s", "t"), {"c": 3}, "logits", Counter())
    assert memo.get(("batch", "b1", (2, 20), "s", "t")) is None
    assert memo.get(("prefix", (1, 2), (2,), "s"))[0] == {"c": 1}
    cache, logits, calls = memo.get(("batch", "b2", (2, 30), "s", "t"))
    assert cache == {"c": 3} and logits == "logits" and calls == Counter()
