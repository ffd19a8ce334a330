"""Triton kernel paths under test. Import modules lazily: TRITON_INTERPRET must be set
before any of them is imported (pq2verify.backend does that)."""
