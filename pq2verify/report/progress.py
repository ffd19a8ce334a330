"""Progress of long runs on stderr: a `\\r` counter on a terminal; in a log (CI, a pipe), one
plain line every few seconds instead of thousands of carriage returns."""
import sys
import time


class Progress:
    def __init__(self, total: int, *, every_s: float = 10.0, stream=None, clock=time.monotonic):
        self.total, self.every_s, self.clock = total, every_s, clock
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = self.last = clock()

    def update(self, done: int, what: str = "") -> None:
        now = self.clock()
        line = f"[{done}/{self.total}] {now - self.t0:.0f}s {what}"
        if self.tty:
            print(f"\r{line[:100]:100s}", end="", file=self.stream, flush=True)
        elif now - self.last >= self.every_s or done == self.total:
            self.last = now
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)
