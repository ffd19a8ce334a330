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


@pytest.fixture
def register_path():
    """register_path(entry, kernel, *, protocol=None, **claims) -> the suite's Path: a path added
    for this test only, as a kernel file, its table entry and its claims add one.

    entry: a kernels.table.Entry (the dispatch facts; entry.module is the name the kernel is
    installed under). kernel: that module (run, config, configs, fold: docs/ADDING_A_PATH.md), or
    a bare run callable, wrapped in a module with `protocol`'s functions ({"fold": ..., ...}).
    claims: the registry's (tol_reason, reference, dots_equal_to, bit_identical_to, ...).
    Dispatch, the kernel sets, the bad-input contract, check, golden, selftest and the bench all
    read it; everything is undone and the dispatch caches cleared after the test."""
    import sys
    import types

    from kernels import dispatch, sets, table
    from pq2verify import registry

    mp = pytest.MonkeyPatch()

    def clear():
        dispatch.clear_cache()
        sets.clear_cache()

    def add(entry, kernel, *, protocol=None, **claims):
        if not isinstance(entry, table.Entry):
            raise TypeError(f"register_path: entry must be a kernels.table.Entry, got {type(entry).__name__}")
        if entry.name in registry.BY_NAME:
            raise ValueError(f"register_path: path {entry.name!r} exists already")
        if isinstance(kernel, types.ModuleType):
            mod = kernel
        else:
            mod = types.ModuleType(entry.module)
            mod.run = kernel
            vars(mod).update(protocol or {})
        mp.setitem(sys.modules, entry.module, mod)
        p = registry.with_claims(entry, claims)
        mp.setattr(registry, "PATHS", registry.PATHS + (p,))
        mp.setitem(registry.BY_NAME, p.name, p)
        clear()
        return p

    yield add
    mp.undo()
    clear()


@pytest.fixture
def cpu_only(device):
    """A test of the suite's own logic (attribution, lookups, rendering) that runs its kernels on
    CPU tensors under the interpreter: under --device cuda the kernels are compiled and cannot
    take them, and the CPU suite, which CI runs, is where it is judged."""
    if device == "cuda":
        pytest.skip("judged by the CPU suite: its kernels run on CPU tensors under the interpreter")
