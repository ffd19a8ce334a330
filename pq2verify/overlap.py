"""Forced overlap for the concurrency checks (CUDA only).

A race between two graphs replayed on two streams shows only when their kernels really run at
the same time; on an idle GPU, host submission order alone usually serialises them (an earlier
test caught a shared-workspace race only when other processes loaded the GPU). `rendezvous`
makes the overlap certain: a one-program kernel that each party launches first on its stream;
it announces itself and spins until the other party has arrived, so the work queued behind it
on both streams is released together. It counts successful meetings in a witness, so a check
can prove the overlap happened instead of assuming it.

The counter only grows (no reset), so the same captured graph can meet its partner on every
replay: a party arriving as number `old` waits until the count reaches the end of its round,
`(old // parties + 1) * parties`.
"""
import torch
import triton
import triton.language as tl

MAX_SPIN = 1 << 22     # about a second of polling: a partner that never comes is a timeout, not a hang


@triton.jit(do_not_specialize=["parties"])   # one binary for any party count, warmed with 1
def _rendezvous_kernel(state_ptr, parties, MAX_SPIN: tl.constexpr):
    old = tl.atomic_add(state_ptr, 1)
    target = (old // parties + 1) * parties
    seen = old + 1
    i = 0
    while (seen < target) & (i < MAX_SPIN):
        seen = tl.atomic_add(state_ptr, 0)
        i += 1
    tl.atomic_add(state_ptr + 1, (seen >= target).to(tl.int32))


class Rendezvous:
    """`meet()` launches one party's arrival on the current stream (capturable in a graph).
    `met()` is the number of arrivals that found their partners (synchronises)."""

    def __init__(self, parties: int = 2, device="cuda", max_spin: int = MAX_SPIN):
        self.parties, self.max_spin = parties, max_spin
        self.state = torch.zeros(2, dtype=torch.int32, device=device)   # [arrivals, met]
        # compile now, alone (a party of one meets at once): never inside a graph capture
        _rendezvous_kernel[(1,)](torch.zeros(2, dtype=torch.int32, device=device), 1,
                                 MAX_SPIN=max_spin, num_warps=1)
        # the zeros above were written on the current stream; the parties run on others, which
        # do not wait for it: a party counted before the fill would be wiped (seen on a loaded
        # GPU as one arrival of two and no meeting)
        torch.cuda.synchronize(device)

    def meet(self) -> None:
        _rendezvous_kernel[(1,)](self.state, self.parties, MAX_SPIN=self.max_spin, num_warps=1)

    def met(self) -> int:
        return int(self.state[1].item())

    def arrivals(self) -> int:
        return int(self.state[0].item())


# --- a held producer, for programmatic dependent launch (PDL) -----------------------------
# A PDL consumer may run while the kernel before it on the stream still does; it must read
# that kernel's output only after griddepcontrol.wait. Whether a read before the wait sees
# stale data depends on timing, unless the producer is made to hold: `Hold` launches a producer
# that first lets its dependents launch (griddepcontrol.launch_dependents), then spins on the
# global timer for `hold_ns`, and only then writes what the consumer reads. A consumer that
# reads before its wait reads the poison left in place every time; one that waits sees the data.
# The producer itself sits behind a gate (a Rendezvous of two) that opens only once the host has
# enqueued the consumer too, so host launch latency cannot use up the hold.

HOLD_NS = 200_000        # 200 us: some 20-50x a dependent's launch latency plus a small consumer's run
HOLD_MAX_SPIN = 1 << 24  # timer reads: a frozen timer ends the hold instead of hanging
GATE_SPIN = 1 << 26      # some 16 s of polling: the host enqueues (and may compile) the consumer


@triton.jit
def _copy_words(src, dst, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=ok), mask=ok)


@triton.jit
def _hold_kernel(s0, d0, n0, s1, d1, n1, s2, d2, n2, s3, d3, n3, witness_ptr, hold_ns,
                 MAX_SPIN: tl.constexpr, BLOCK: tl.constexpr):
    # first: the dependent grid may launch now, long before anything below is written
    tl.extra.cuda.gdc_launch_dependents()
    t0 = tl.extra.cuda.globaltimer()
    now = t0
    i = 0
    while (now - t0 < hold_ns) & (i < MAX_SPIN):
        now = tl.extra.cuda.globaltimer()
        i += 1
    _copy_words(s0, d0, n0, BLOCK)
    _copy_words(s1, d1, n1, BLOCK)
    _copy_words(s2, d2, n2, BLOCK)
    _copy_words(s3, d3, n3, BLOCK)
    tl.store(witness_ptr + 1, t0)
    tl.store(witness_ptr + 2, now)
    tl.store(witness_ptr + 3, i.to(tl.int64))
    tl.store(witness_ptr, tl.full([], 1, tl.int64))      # done: the last store


@triton.jit
def _probe_kernel(witness_ptr, seen_ptr):
    # a PDL dependent that reads the producer's done flag before and after its wait
    start = tl.extra.cuda.globaltimer()
    before = tl.load(witness_ptr, volatile=True)
    tl.extra.cuda.gdc_wait()
    after = tl.load(witness_ptr, volatile=True)
    tl.store(seen_ptr, before)
    tl.store(seen_ptr + 1, after)
    tl.store(seen_ptr + 2, start)


def _words(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous() or (t.numel() * t.element_size()) % 4:
        raise ValueError(f"Hold: copies need contiguous tensors of whole 32-bit words, got {tuple(t.shape)} "
                         f"{t.dtype} strides {t.stride()}")
    return t.reshape(-1).view(torch.int32)


def word_views(copies) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(src, dst) pairs, at most four, of equal shape and dtype -> their int32 word views (views:
    a write to dst's lands in dst), as the producer copies them."""
    copies = list(copies)
    if len(copies) > 4:
        raise ValueError(f"Hold: at most four copies, got {len(copies)}")
    out = []
    for src, dst in copies:
        if src.dtype != dst.dtype or src.shape != dst.shape or src.device != dst.device:
            raise ValueError(f"Hold: copy {tuple(src.shape)} {src.dtype} on {src.device} -> "
                             f"{tuple(dst.shape)} {dst.dtype} on {dst.device}")
        out.append((_words(src), _words(dst)))
    return out


class Hold:
    """`arm(copies)` enqueues, on the current stream: the gate, then the producer (trigger its
    dependents, hold `hold_ns`, copy each (src, dst) pair, at most four, then set a done flag).
    Launch the PDL consumer right after it on the same stream, then call `release()` (opens the
    gate from a side stream). After a synchronize, `witness()` says whether the gate opened and
    how long the producer held. One Hold serves any number of rounds."""

    def __init__(self, hold_ns: int = HOLD_NS, device="cuda"):
        self.hold_ns, self.device, self.rounds = int(hold_ns), device, 0
        self._seen_rounds = self._seen_met = 0      # at the last witness(): its gate is judged anew
        self._gate = Rendezvous(2, device=device, max_spin=GATE_SPIN)
        self._side = torch.cuda.Stream(device=device)
        self._state = torch.zeros(4, dtype=torch.int64, device=device)    # [done, t0, t_end, spins]
        self._seen = torch.full((3,), -1, dtype=torch.int64, device=device)  # the probe's
        self._dummy = torch.zeros(1, dtype=torch.int32, device=device)
        self._keep: list = []
        self._warm: set = set()     # the producer's specializations compiled and loaded
        # compile now, outside any timing: no hold, no copies
        self._launch([], torch.zeros(4, dtype=torch.int64, device=device), 0)
        _probe_kernel[(1,)](self._state, torch.zeros(3, dtype=torch.int64, device=device), num_warps=1,
                            launch_pdl=True)
        torch.cuda.synchronize(device)

    def _launch(self, copies, state, hold_ns) -> None:
        args = []
        for s, d in word_views(copies):
            args += [s, d, s.numel()]
        args += [self._dummy, self._dummy, 0] * (4 - len(copies))
        _hold_kernel[(1,)](*args, state, hold_ns, MAX_SPIN=HOLD_MAX_SPIN, BLOCK=1024, num_warps=1)

    @staticmethod
    def _key(copies) -> tuple:
        """What the producer's compiled specialization depends on: the copies' sizes (ints are
        specialized as 1 or multiples of 16) and their addresses' 16-byte alignment."""
        return tuple((s.numel(), s.data_ptr() % 16, d.data_ptr() % 16) for s, d in word_views(copies))

    def warm(self, copies) -> None:
        """Compile and load the producer's specialization for copies like these, with no hold and
        into scratch buffers of the same alignment. A module loaded while the gate spins waits for
        the device to go idle, i.e. for the gate to time out: arm() warms each new one first."""
        key = self._key(copies)
        if key in self._warm:
            return
        scratch = []
        for s, d in word_views(copies):     # int32 words; d's offset within 16 bytes kept
            off = (d.data_ptr() % 16) // 4
            scratch.append((s, torch.empty(d.numel() + off, dtype=torch.int32, device=d.device)[off:]))
        self._launch(scratch, torch.zeros(4, dtype=torch.int64, device=self.device), 0)
        torch.cuda.synchronize(self.device)
        self._warm.add(key)

    def arm(self, copies=()) -> None:
        copies = list(copies)
        if not torch.cuda.is_current_stream_capturing():
            self.warm(copies)
        self._keep = copies                   # the sources stay alive until the next round
        self._state.zero_()                 # fills go before the gate: between the producer and
        self._seen.fill_(-1)                # its consumer no other kernel may run
        self._gate.meet()
        self._launch(copies, self._state, self.hold_ns)
        self.rounds += 1

    def release(self) -> None:
        with torch.cuda.stream(self._side):
            self._gate.meet()

    def probe(self) -> torch.Tensor:
        """A PDL dependent of the armed producer, on the current stream right after arm(): [done
        before its wait, done after it, its start time in ns] (synchronise before reading)."""
        _probe_kernel[(1,)](self._state, self._seen, num_warps=1, launch_pdl=True)
        return self._seen

    def witness(self) -> dict:
        """After a synchronize: the gate opened properly for every round since the last call (both
        parties met, none timed out), the last producer finished, its start time and how long it
        held (ns), its timer reads."""
        done, t0, t1, spins = (int(v) for v in self._state.tolist())
        met = self._gate.met()
        released = met - self._seen_met == 2 * (self.rounds - self._seen_rounds)
        self._seen_met, self._seen_rounds = met, self.rounds
        return dict(released=released, done=done == 1, t0=t0, held_ns=t1 - t0, spins=spins)
