"""The GPU tuning scripts (tools/tune/, tools/profile/decode_kernel.py) and the sm_90 compile
(python -m pq2verify.sm90) refuse impossible options with exit 2 and a message naming the
option, before any GPU or compile work (run here on the CPU)."""
import runpy
import sys
from pathlib import Path

import pytest

TUNE = Path(__file__).resolve().parents[1] / "tools" / "tune"


def _run(tool, argv):
    """The command line `python tools/tune/<tool>.py ARGV` (or `python -m pq2verify.sm90 ARGV`), run
    in this process as its __main__."""
    if tool == "sm90":
        from pq2verify.sm90 import cli
        return cli.main(argv)
    sys.argv = [f"{tool}.py", *argv]
    where = TUNE.parent / "profile" if tool in ("decode_kernel", "decode_boundary", "prefill_isolate") else TUNE
    runpy.run_path(str(where / f"{tool}.py"), run_name="__main__")


@pytest.mark.parametrize("tool,argv,msg", [
    ("mma_sweep", ["--m", "0"], "argument --m: expected an integer >= 1"),
    ("mma_sweep", ["--shapes", "gate_up,bogus"], "unknown shape ['bogus']"),
    ("mma_sweep", ["--shapes", "in_proj_ba"], "unknown shape ['in_proj_ba']"),     # dense: not a PQ2 shape
    ("mma_sweep", ["--old", "no/such/small_mma.py"], "argument --old: no such file"),
    ("prefill_sweep", ["--m", "512,-1"], "argument --m: expected an integer >= 1"),
    ("prefill_sweep", ["--shapes", ","], "unknown shape none"),
    ("prefill_sweep", ["--variants", '[{"BM": 3}]'], "BM=3"),
    ("prefill_sweep", ["--path", "gemv"], "gemv: not a prefill path of PQ2 weights (serves M 1)"),
    ("prefill_sweep", ["--path", "nosuch"], "unknown path 'nosuch'"),
    ("prefill_sweep", ["--variants", '{"BM": 64}'], "expected a JSON list of objects"),
    ("sm90", ["loop", "--k", "100"], "argument --k: expected a multiple of 128"),
    ("sm90", ["loop", "--m", "17"], "argument --m: small_mma serves M 1-16"),
    ("sm90", ["loop", "--n", "0"], "argument --n: expected an integer >= 1"),
    ("sm90", ["loop", "--config", '{"SPLIT": 0}'], "argument --config: small_mma: config field SPLIT=0"),
    ("sm90", ["loop", "--module", "no/such.py"], "argument --module: no such file"),
    ("sm90", ["bogus"], "invalid choice: 'bogus'"),
    ("sm90", ["prefill", "--m", "16"], "argument --m: mmq_wgmma serves M 17+, got 16"),
    ("sm90", ["prefill", "--config", '{"BN": 96}'], "argument --config: mmq_wgmma: config field BN=96"),
    ("step_ab", ["--variants", "nope"], "argument --variants: not JSON"),
    ("step_ab", ["--variants", '{"a": {}}', "--no-step"], "argument --no-step: without --shapes nothing would be timed"),
    ("step_ab", ["--variants", '{"a": {}}', "--reps", "-1"], "argument --reps: expected an integer >= 1"),
    ("step_ab", ["--variants", "{}"], "argument --variants: expected {label: {field: value}}"),
    ("step_ab", ["--variants", '{"a": {"BOGUS": 1}}'], "variant 'a' at M=1: gemv: config field 'BOGUS' unknown"),
    ("step_ab", ["--variants", '{"a": {"UNROLL": 2}}', "--m", "4"], "not a multiple of UNROLL=2 (at N="),
    ("step_ab", ["--variants", '{"a": {}}', "--m", "17"], "argument --m: decode Ms are 1-16"),
    ("step_ab", ["--variants", '{"a": {"SPLIT1": 3}}'], "variant 'a': SPLIT1=3: expected true or false"),
    ("decode_kernel", ["cublas", "out", "1"], "argument path: invalid choice: 'cublas'"),
    ("decode_kernel", ["gemv", "out", "0"], "argument m: expected an integer >= 1"),
    ("decode_kernel", ["gemv", "out", "2"], "argument m: gemv runs M 1-1 here, got 2"),
    ("decode_kernel", ["small_mma", "out", "17"], "argument m: small_mma runs M 1-16 here, got 17"),
    ("decode_kernel", ["small_mma", "in_proj_ba", "4"], "argument shape: expected one of"),
    ("decode_kernel", ["small_mma", "out", "4", "[1]"], "argument config: expected a JSON object"),
    ("decode_kernel", ["small_mma", "out", "4", '{"BOGUS": 1}'], "argument config: small_mma: config field 'BOGUS'"),
    ("decode_kernel", ["mmq_wgmma", "out", "4", '{"BM": 16}'], "argument config: mmq_wgmma: config field BM=16"),
    ("decode_kernel", ["gemv", "out", "1", "--calls", "0"], "argument --calls: expected an integer >= 1"),
    ("step_ab", ["--variants", '{"a": {"PATH": "mmq"}}'], "variant 'a': PATH='mmq': expected one of gemv, gemv_pair, mmq_wgmma, small_mma"),
    ("step_ab", ["--m", "2,4", "--variants", '{"a": {"PATH": "gemv_pair"}}'], "variant 'a': PATH='gemv_pair' computes M=2 only, got --m 2,4"),
    ("step_ab", ["--m", "2", "--variants", '{"a": {"PATH": "gemv"}}'], "variant 'a': PATH='gemv' computes M=1 only, got --m 2"),
    ("step_ab", ["--variants", '{"a": {"PATH": "mmq_wgmma", "BM": 16}}'], "mmq_wgmma: config field BM=16"),
    ("step_ab", ["--variants", '{"a": {"PATH": "mmq_wgmma", "BM": 48}}'], "BM=48"),
    ("step_ab", ["--variants", '{"a": {"PATH": "mmq_wgmma", "SPLIT1": true}}'], "SPLIT1 with PATH mmq_wgmma"),
    ("step_ab", ["--variants", '{"a": {}}', "--shapes", "bogus"], "unknown shape ['bogus']"),
    ("step_ab", ["--variants", '{"a": {}}', "--rounds", "0"], "argument --rounds: expected an integer >= 1"),
    ("decode_boundary", ["b.json"], "the following arguments are required: --shapes"),
    ("decode_boundary", [".", "--shapes", "out"], "argument dest: '.' is a folder"),
    ("decode_boundary", ["no/such/dir/b.json", "--shapes", "out"], "in no existing folder"),
    ("decode_boundary", ["b.json", "--shapes", "gate_up,bogus"], "unknown shape ['bogus']"),
    ("decode_boundary", ["b.json", "--shapes", "in_proj_ba"], "unknown shape ['in_proj_ba']"),
    ("decode_boundary", ["b.json", "--shapes", "out", "--reps", "0"], "argument --reps: expected an integer >= 1"),
    ("prefill_isolate", ["b.json", "--m", "16"], "mmq_wgmma serves M 17+, got 16"),
    ("prefill_isolate", [".", "--m", "2048"], "argument dest: '.' is a folder"),
    ("prefill_isolate", ["b.json", "--shapes", "in_proj_ba"], "unknown shape ['in_proj_ba']"),
    ("prefill_isolate", ["b.json", "--rounds", "0"], "argument --rounds: expected an integer >= 1"),
])
def test_refuses_impossible_options(tool, argv, msg, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))     # _run sets it; restored after
    with pytest.raises(SystemExit) as e:
        _run(tool, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is visible: the tool would time on it")
def test_decode_boundary_refuses_to_run_without_a_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    dest = tmp_path / "b.json"
    with pytest.raises(SystemExit) as e:
        _run("decode_boundary", [str(dest), "--shapes", "out"])
    assert e.value.code == 2 and "none is visible" in capsys.readouterr().err
    assert not dest.exists()


def test_step_ab_widens_mmq_wgmma_token_tiles_only_while_it_runs():
    # the tool times BM 32-128; the path's own rule (its prefill tiles) is back once it returns
    from kernels import mmq_wgmma
    rule = mmq_wgmma.FIELDS
    with pytest.raises(SystemExit):
        _run("step_ab", ["--variants", '{"a": {"PATH": "mmq_wgmma", "BM": 16}}'])
    assert mmq_wgmma.FIELDS is rule
    with pytest.raises(ValueError, match="BM=32"):
        mmq_wgmma.fold(5120, 5120, 16, interpret=False, config={"BM": 32})
