"""Fixtures shared by the tests (the device option, skips and mode guard are the root conftest's)."""
import pytest


@pytest.fixture
def run_cli(capsys):
    """run_cli(argv) -> (exit code, stdout, stderr) of an in-process `pq2verify ARGV`, argparse's
    own errors (SystemExit) included: how the contract tests drive every command."""
    from pq2verify import cli

    def run(argv):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run
