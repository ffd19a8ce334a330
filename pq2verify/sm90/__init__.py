"""Static checks of the kernels compiled for sm_90 without a GPU: the PDL order (ptx, pdl), the
resource gate (resources, gate), small_mma's loop budget and mmq_wgmma's compile (cli). Run as
`TRITON_INTERPRET=0 python -m pq2verify.sm90 {loop,prefill,pdl,resources} ...`; ptx and
resources need no compiler and import nothing heavy."""
