"""The expert-paged qwen3moe and qwen35moe engine under test (see docs/engine-contract.md)."""

import os

# How long numba's OpenMP threads spin before sleeping between parallel regions; must be
# set before numba starts its thread pool, i.e. before any kernel runs. A decode step is
# ~75 regions with tens of microseconds of Python between them: threads that sleep at once
# (OMP_WAIT_POLICY=PASSIVE) pay ~40 us of wake-up per region, which cost -t 2 a fifth of its
# decode speed (68 -> 89 tok/s on bench with a short spin). libgomp's default spin (300000
# iterations, ~7 ms) starves the other thread on a loaded 2-core runner: -t 2 ran 25x
# slower than -t 1 there. 2000 iterations (~50 us; pause is 25-60 ns) covers the gaps
# between a step's regions and bounds what is burnt when the CPUs are shared
# (docs/PERF.md, "OpenMP waiting"). KMP_BLOCKTIME: the same for Intel's and LLVM's runtime,
# which numba may link instead; 0 is their passive waiting. A wait policy the user sets wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "2000")
    os.environ.setdefault("KMP_BLOCKTIME", "0")
