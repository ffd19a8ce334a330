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

    def meet(self) -> None:
        _rendezvous_kernel[(1,)](self.state, self.parties, MAX_SPIN=self.max_spin, num_warps=1)

    def met(self) -> int:
        return int(self.state[1].item())

    def arrivals(self) -> int:
        return int(self.state[0].item())
