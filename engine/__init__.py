"""The expert-paged qwen3moe and qwen35moe engine under test (see docs/engine-contract.md)."""

import os

# numba's OpenMP layer spins while waiting for work by default; on a shared 2-core runner
# that spinning starves the other thread and -t 2 ran 25x slower than -t 1 (measured:
# 0.36 vs 9.4 tok/s under load; 14.3 tok/s with passive waiting). Must be set before
# numba starts its thread pool, i.e. before any kernel runs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
