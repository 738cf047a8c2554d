"""`--contract-info`: what this engine declares under docs/engine-contract.md -- the
contract version it speaks, the architectures and weight types it runs, and the optional
features it implements. epmci reads it before gating the engine: suites that need a feature
the engine lacks are skipped with that reason, and pager flags go only to an engine with a
pager."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .gguf_model import ARCHS
from .qtypes import QTYPES

CONTRACT_VERSION = 2
NAME = "epm-engine"
# The optional features of the contract this engine implements (docs/engine-contract.md,
# Capabilities): the expert pager (with --no-pager, the budget and the SDQ_* switches),
# --selftest (repeatable: several in one process), SDQ_MOE_DUMP, SDQ_PREFETCH_DUMP,
# SDQ_STATE_DUMP, --profile-out / SDQ_PROFILE_IN, --tokens-in, --pace-fds, and logits
# bit-identical to epmci's reference (the kernels follow ggml's generic C order).
FEATURES = ("pager", "selftest", "selftest_batch", "moe_dump", "prefetch_dump", "state_dump", "profile",
            "teacher_forcing", "pacing", "reference_exact")


# The matrix-product kernel paths it has (`--kernels P`; bit-identical on each), each with the
# CPU flags (/proc/cpuinfo's names) it needs: AVX2 needs F16C for the f16 scales, AVX-512 adds
# F, BW (the byte and word multiply-adds) and VL. A path the CPU cannot run is refused, exit 2,
# one line; the gate fails a refusal on a CPU that has every flag declared.
KERNEL_CPU_FLAGS = {"portable": (), "avx2": ("avx2", "f16c"),
                    "avx512": ("avx2", "f16c", "avx512f", "avx512bw", "avx512vl")}
KERNEL_PATHS = tuple(KERNEL_CPU_FLAGS)


def numba_compiles_for_host() -> bool:
    """The SIMD paths exist only when numba targets this CPU (NUMBA_CPU_NAME unset or host)."""
    import numba          # here, not at the top: most of what imports this module never compiles
    return numba.config.CPU_NAME in (None, "host")


def engine_version() -> str:
    try:
        return version("epmci")     # the distribution the bundled engine ships in
    except PackageNotFoundError:
        return "unknown"


def contract_info() -> dict:
    # Under another numba target the SIMD paths cannot be chosen on any CPU: not declared then.
    declared = [p for p, flags in KERNEL_CPU_FLAGS.items() if not flags or numba_compiles_for_host()]
    return {"contract": CONTRACT_VERSION,
            "engine": {"name": NAME, "version": engine_version()},
            "architectures": list(ARCHS),
            "quant_types": [t.name for t in QTYPES.values()],
            "features": list(FEATURES),
            "kernel_paths": declared,
            "kernel_cpu_flags": {p: list(KERNEL_CPU_FLAGS[p]) for p in declared}}
