"""The forced-overlap tools set up in an order no timing can break (pq2verify.overlap), checked
on the CPU with the CUDA calls recorded instead of run:
- a Rendezvous' counter is zeroed on the current stream, and its parties run on other streams,
  which do not wait for that stream: the constructor must synchronise before returning (the H200
  suite once saw one arrival of two and no meeting);
- a module loaded while the Hold's gate spins waits for the device to go idle, i.e. for the gate
  to time out: arm() must compile and load the producer's specialization for new copies before
  it launches the gate, and only once per specialization."""
import torch

from pq2verify import overlap

HERE = "tests/test_overlap_order.py"


class _Launcher:
    """Stands for a Triton kernel: kernel[grid](*args, **kw) appends (name, args, kw) to log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *a, **kw: self.log.append((self.name, a, kw))


def _cuda(monkeypatch, log):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: log.append(("synchronize",)))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())


def test_a_rendezvous_is_zeroed_for_every_stream_before_it_is_used(monkeypatch):
    log = []
    _cuda(monkeypatch, log)
    monkeypatch.setattr(overlap, "_rendezvous_kernel", _Launcher("rendezvous", log))
    r = overlap.Rendezvous(2, device="cpu")
    names = [e[0] for e in log]
    assert names == ["rendezvous", "synchronize"], (
        f"the constructor did {names}; its state must be zero on every stream before a party runs"
        f"\n  reproduce: .venv/bin/python -m pytest -q '{HERE}'")
    assert r.state.tolist() == [0, 0]


def _hold(monkeypatch, log):
    _cuda(monkeypatch, log)
    monkeypatch.setattr(overlap, "_rendezvous_kernel", _Launcher("gate", log))
    monkeypatch.setattr(overlap, "_hold_kernel", _Launcher("producer", log))
    monkeypatch.setattr(overlap, "_probe_kernel", _Launcher("probe", log))
    h = overlap.Hold(device="cpu")
    log.clear()
    return h


def _hold_ns(entry):
    return entry[1][-1]          # _hold_kernel(..., state, hold_ns, MAX_SPIN=..., ...)


def test_arm_loads_the_producer_for_new_copies_before_its_gate(monkeypatch):
    log = []
    h = _hold(monkeypatch, log)
    src, dst = torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    h.arm([(src, dst)])
    steps = [(e[0], _hold_ns(e) if e[0] == "producer" else None) for e in log]
    where = f"\n  steps: {steps}\n  reproduce: .venv/bin/python -m pytest -q '{HERE}'"
    assert steps == [("producer", 0), ("synchronize", None), ("gate", None), ("producer", h.hold_ns)], (
        "arm() must warm the new specialization (no hold) and synchronise before the gate" + where)
    warm = log[0][1]
    assert warm[0] is not None and warm[1].data_ptr() != dst.data_ptr(), "the warm-up wrote the real destination" + where
    log.clear()
    h.arm([(src, dst)])
    assert [e[0] for e in log] == ["gate", "producer"], f"a warmed specialization was warmed again: {log}" + where
    log.clear()
    h.arm([(torch.arange(48, dtype=torch.int32), torch.zeros(48, dtype=torch.int32))])
    assert [e[0] for e in log][:2] == ["producer", "synchronize"], "another size is another specialization" + where


def test_the_warm_up_keeps_each_destination_s_alignment(monkeypatch):
    """Triton specializes pointers on 16-byte alignment: a scratch destination aligned
    otherwise would compile another binary, and the real one would still load inside the gate."""
    log = []
    h = _hold(monkeypatch, log)
    base = torch.zeros(80, dtype=torch.int32)
    for off in (0, 1, 2, 3):
        dst = base[off:off + 64]
        log.clear()
        h.arm([(torch.arange(64, dtype=torch.int32), dst)])
        warm = log[0][1]         # (src, dst, n, dummy...) of the warm-up
        assert log[0][0] == "producer" and _hold_ns(log[0]) == 0, f"offset {off}: {log}"
        assert warm[1].data_ptr() % 16 == dst.data_ptr() % 16 and warm[1].data_ptr() != dst.data_ptr(), (
            f"offset {off} words: scratch at {warm[1].data_ptr() % 16} mod 16, destination at "
            f"{dst.data_ptr() % 16}\n  reproduce: .venv/bin/python -m pytest -q '{HERE}'")
