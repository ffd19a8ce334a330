"""The output-file contract every command shares (pq2verify/outputs.py): refused before any work,
written without loss after it."""
import argparse
import os

import pytest

from pq2verify import cli, outputs


@pytest.mark.parametrize("outs, ins, dirs, says", [
    ([("--json", "F"), ("--html", "F")], [], [], "the same file as --json"),
    ([("--json", "F"), ("--markdown", "./F")], [], [], "the same file as --json"),
    ([("--html", "R.json")], [("--render", "R.json")], [], "is the input --render"),
    ([("--json", "cap/manifest.json")], [("--dir", "cap")], [], "inside the input folder --dir"),
    ([("--html", "out/report.json")], [], [("--out", "out")], "inside the folder of --out"),
    ([("--json", "")], [], [], "--json: empty path"),
    ([("--json", "/dev/full")], [], [], "cannot write"),
])
def test_collisions_and_unwritable_paths_are_refused(tmp_path, monkeypatch, outs, ins, dirs, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "R.json").write_text("{}")
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "manifest.json").write_text("{}")
    with pytest.raises(cli.UsageError, match=says):
        outputs.check(outs, ins, folders=dirs)
    assert (tmp_path / "R.json").read_text() == "{}"      # nothing written by the check


def test_distinct_outputs_pass(tmp_path):
    outputs.check([("--json", tmp_path / "a.json"), ("--html", tmp_path / "a.html"), ("--markdown", None)],
                  [("--render", tmp_path / "in.json")], folders=[("--out", tmp_path / "o")])


def test_a_failed_write_keeps_the_old_file_and_names_every_failure(tmp_path):
    old = tmp_path / "keep.json"
    old.write_text("old")
    with pytest.raises(outputs.WriteError) as e:
        outputs.write_all([("--json", "/dev/full", "x"), ("--markdown", tmp_path / "m.md", lambda: "md")])
    assert "--json /dev/full" in str(e.value) and "No space left" in str(e.value)
    assert (tmp_path / "m.md").read_text() == "md"         # the other output was still written
    assert old.read_text() == "old"
    outputs.write_text(old, "new", "--json")
    assert old.read_text() == "new"
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_main_turns_a_write_failure_into_its_own_exit_code(monkeypatch, capsys):
    def boom(args):
        print("verdict: PASS")
        raise outputs.WriteError("--json /dev/full: could not write: No space left on device")
    ap = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: ap)
    args = ap.parse_args(["check"])
    monkeypatch.setattr(ap, "parse_args", lambda argv=None: argparse.Namespace(**{**vars(args), "func": boom}))
    assert cli.main(["check"]) == outputs.EXIT_WRITE == 3
    out = capsys.readouterr()
    assert "verdict: PASS" in out.out and "could not write" in out.err


@pytest.mark.parametrize("parse, value", [
    (cli.positive_ints, ""), (cli.positive_ints, ","), (cli.positive_ints, "1,,2"), (cli.positive_ints, "1,1"),
    (cli.names, ""), (cli.names, ","), (cli.names, "a,"), (cli.names, "a,a"), (cli.nonempty, ""), (cli.nonempty, " "),
    (cli.positive_float, "0"), (cli.positive_float, "-1"), (cli.positive_float, "nan"), (cli.positive_float, "inf"),
    (cli.positive_float, "x"), (cli.nonneg_float, "-0.1"), (cli.nonneg_float, "nan"),
])
def test_empty_and_duplicate_values_are_usage_errors(parse, value):
    with pytest.raises(argparse.ArgumentTypeError):
        parse(value)


def test_floats_in_range_pass():
    assert cli.positive_float("0.5") == 0.5 and cli.nonneg_float("0") == 0.0


def test_lists_keep_their_order():
    assert cli.positive_ints("16,1,4") == [16, 1, 4]
    assert cli.names(" gemv, single") == ["gemv", "single"]


def test_a_written_file_gets_the_usual_mode(tmp_path):
    new, old = tmp_path / "new.md", tmp_path / "old.md"
    old.write_text("x")
    old.chmod(0o640)
    outputs.write_text(new, "y", "--markdown")
    outputs.write_text(old, "z", "--markdown")
    u = os.umask(0)
    os.umask(u)
    assert new.stat().st_mode & 0o777 == 0o666 & ~u
    assert old.stat().st_mode & 0o777 == 0o640
