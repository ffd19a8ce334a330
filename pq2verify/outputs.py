"""Output files of a command: checked before any work, written so that nothing is lost.

- `check` (before the work): an empty path, two outputs on one file, an output on an input or
  inside an input folder, and a path that cannot be written are usage errors (exit 2).
- `write_text` / `write_all` (after the work, once the console verdict is printed): a regular
  file is written to a temporary file beside it and renamed into place, so a failed write leaves
  the old file whole; a failure is a `WriteError`, which `cli.main` reports with exit code 3
  (`EXIT_WRITE`), distinct from a failed check (1).
"""
import os
import stat
import tempfile
from collections.abc import Callable, Iterable

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_WRITE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {
    EXIT_PASS: "every check passed",
    EXIT_FAIL: "a check failed (the verdict says which)",
    EXIT_USAGE: "bad input: an option, a file or the environment; nothing was run",
    EXIT_WRITE: "an output file could not be written (the verdict printed before it stands)",
    EXIT_INTERRUPTED: "interrupted; results written so far are kept",
}


class WriteError(Exception):
    """An output could not be written after the work was done."""


def _usage(msg: str):
    from .cli import UsageError
    return UsageError(msg)


def _real(path) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _inside(p: str, folder: str) -> bool:
    return p != folder and os.path.commonpath([p, folder]) == folder


def check(outputs: Iterable[tuple[str, object]] = (), inputs: Iterable[tuple[str, object]] = (), *,
          folders: Iterable[tuple[str, object]] = ()) -> None:
    """Refuse, before any work: an empty output path; two outputs on one file; an output that is
    an input or lies inside an input folder; an output file inside an output folder (`folders`:
    options whose value is a folder the command writes into, e.g. gsm8k --out); a path that
    cannot be written. Entries whose path is None are options not given."""
    from .cli import check_writable
    outs = [(opt, p) for opt, p in outputs if p is not None]
    dirs = [(opt, p) for opt, p in folders if p is not None]
    for opt, p in outs + dirs:
        if os.fspath(p).strip() == "":
            raise _usage(f"{opt}: empty path")
    seen: dict[str, str] = {}
    for opt, p in outs:
        r = _real(p)
        if r in seen:
            raise _usage(f"{opt} {os.fspath(p)}: the same file as {seen[r]}; each output needs its own file")
        seen[r] = opt
    for opt, p in outs:
        r = _real(p)
        for dopt, d in dirs:
            if _inside(r, _real(d)) or r == _real(d):
                raise _usage(f"{opt} {os.fspath(p)}: inside the folder of {dopt} {os.fspath(d)}, "
                             "which the command writes; choose a path outside it")
    for iopt, i in inputs:
        if i is None:
            continue
        ri = _real(i)
        for opt, p in outs + dirs:
            r = _real(p)
            if r == ri:
                raise _usage(f"{opt} {os.fspath(p)}: is the input {iopt} {os.fspath(i)}; it would be overwritten")
            if os.path.isdir(ri) and _inside(r, ri):
                raise _usage(f"{opt} {os.fspath(p)}: inside the input folder {iopt} {os.fspath(i)}; "
                             "choose a path outside it")
    for opt, p in outs:
        check_writable(p, opt, make_parents=True)
        _probe_device(p, opt)


def _probe_device(path, opt: str) -> None:
    """An existing device (e.g. /dev/full) passes an open() probe; a zero-byte write asks the
    driver itself, without sending it anything."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError:
        return
    if not stat.S_ISCHR(st.st_mode):
        return
    try:
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"")
        finally:
            os.close(fd)
    except OSError as e:
        raise _usage(f"{opt} {p}: cannot write: {e.strerror or e}") from None


def write_text(path, text: str, option: str) -> None:
    """Write `text` to `path`; a regular file (or a new one) through a temporary file renamed
    into place. Missing parent folders are made. Any OSError becomes a WriteError naming the
    option."""
    p = os.fspath(path)
    try:
        parent = os.path.dirname(os.path.abspath(p))
        os.makedirs(parent, exist_ok=True)
        if os.path.exists(p) and not os.path.isfile(p):
            with open(p, "w") as fh:          # a device or a pipe: written in place, never replaced
                fh.write(text)
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=parent)
        try:
            # mkstemp makes the file 0600; a report gets the mode open() would give it (or keeps
            # the mode of the file it replaces)
            os.fchmod(fd, stat.S_IMODE(os.stat(p).st_mode) if os.path.exists(p) else 0o666 & ~_umask())
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise WriteError(f"{option} {p}: could not write: {e.strerror or e}") from None


class Rewritten:
    """A JSON output rewritten as results arrive (`save(obj)` after each one), so an interrupted
    or crashed run keeps what it measured. A failed write is reported once through `warn` and
    tried again at the next save; the final write (write_all) decides the exit code."""

    def __init__(self, path, option: str, warn):
        self.path, self.option, self.warn, self.failed = path, option, warn, None

    def save(self, obj) -> None:
        if not self.path:
            return
        import json
        try:
            write_text(self.path, json.dumps(obj, indent=1, default=str), self.option)
            self.failed = None
        except WriteError as e:
            if self.failed is None:
                self.warn(f"{e}; the run goes on and writes it again after each result")
            self.failed = e


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def write_all(items: Iterable[tuple[str, object, str | Callable[[], str]]]) -> list[str]:
    """Write each (option, path, text or a function giving it) whose path is not None; go on
    past a failure, then raise one WriteError naming every output that failed. Returns the
    paths written."""
    done, failed = [], []
    for opt, p, text in items:
        if p is None:
            continue
        try:
            write_text(p, text() if callable(text) else text, opt)
            done.append(os.fspath(p))
        except WriteError as e:
            failed.append(str(e))
    if failed:
        raise WriteError("; ".join(failed))
    return done
