"""epmci: the regression gate and correctness CI for expert-paged MoE inference."""

import os

# The reference's BLAS calls run inside the check's worker threads (one per CPU); BLAS
# threads of their own on top oversubscribe the cores (measured on 2 cores under load: the
# reference's integer products 3x slower). Must be set before NumPy loads its BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
