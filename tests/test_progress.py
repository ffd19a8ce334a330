"""pq2verify.report.progress: a terminal gets one rewritten line; a log gets a line every few seconds."""
import io

from pq2verify.report.progress import Progress


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_log_gets_a_line_every_few_seconds_and_the_last():
    out, clock = io.StringIO(), _Clock()
    p = Progress(100, every_s=10, stream=out, clock=clock)
    for i in range(1, 101):
        clock.t = i * 0.5            # 50 s in all
        p.update(i, f"case {i}")
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 5 and lines[0].startswith("[20/100] 10s") and lines[-1].startswith("[100/100] 50s"), lines


def test_terminal_gets_carriage_returns():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    p = Progress(3, stream=out, clock=_Clock())
    for i in range(1, 4):
        p.update(i, "x")
    p.close()
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\n")
