import sys

# When its CPU target first loads, numba probes for scipy's BLAS (numba.np.arraymath), which
# imports all of scipy.linalg: ~0.2 of the ~1.2 CPU-s an engine process takes. The kernels
# call no BLAS (np.dot, np.linalg), so the engine's own process marks scipy.linalg absent
# (numba then has no BLAS; a kernel that needed it would fail to compile, not compute
# differently). Only here, in `python -m engine`: a process importing engine.cli keeps scipy.
sys.modules.setdefault("scipy.linalg", None)

from .cli import main  # noqa: E402

sys.exit(main())
