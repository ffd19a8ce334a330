"""One `--paths` for every subcommand (pq2verify.cli.add_paths_option / parse_paths): the same
bad value gets the same refusal, naming the option and what is wrong, from check, golden
capture, golden verify, selftest and fuzz, before any work (exit 2)."""
import pytest

from pq2verify import checks, golden, registry, selftest

COMMANDS = [["check"], ["golden", "capture"], ["golden", "verify"], ["selftest"], ["fuzz", "--max-cases", "1"]]


def _expected(value: str) -> str:
    """What is wrong with `value`, derived from the value itself."""
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in items):
        return f"argument --paths: expected comma-separated names, got {value!r}"
    dup = sorted({v for v in items if items.count(v) > 1})
    if dup:
        return f"argument --paths: {', '.join(dup)} given twice in {value!r}"
    bad = [v for v in items if v not in registry.BY_NAME]
    return f"--paths: unknown {', '.join(map(repr, bad))}; expected one of {', '.join(registry.BY_NAME)}"


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("work started before the bad --paths was refused")
    for mod, name in ((checks, "evaluate"), (selftest, "run"), (golden, "capture"), (golden, "verify")):
        monkeypatch.setattr(mod, name, refuse)


@pytest.mark.parametrize("value", ["", ",", "single,", "single,single", "bogus", "single,bogus"])
def test_every_command_refuses_a_bad_paths_value_alike(value, run_cli, device, no_work):
    want = _expected(value)
    said = {}
    for cmd in COMMANDS:
        rc, out, err = run_cli(["--device", device, *cmd, "--paths", value])
        line = [ln for ln in err.splitlines() if "error:" in ln]
        assert rc == 2 and line, (cmd, rc, err)
        said[" ".join(cmd)] = line[-1].split("error: ", 1)[1]
    assert set(said.values()) == {want}, said
