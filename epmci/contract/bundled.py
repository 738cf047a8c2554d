"""What is specific to the bundled engine (`python -m engine`, engine/): how it is started,
the environment its runs need, and when a compiled cache can be reused for another source tree
(the warm-up runs that fill numba's on-disk cache: epmci.contract.build). Every other part of epmci treats the
bundled engine as any engine speaking docs/engine-contract.md; epmci never imports engine/.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path


ARGV = (sys.executable, "-m", "engine")


def run_env(root: str | None = None) -> dict[str, str]:
    """An engine of another source tree runs with that tree first on PYTHONPATH."""
    if not root:
        return {}
    return {"PYTHONPATH": str(root) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}


# ------------------------------------------------------------------ numba's compiled cache

def installed_package() -> Path | None:
    spec = importlib.util.find_spec("engine")
    return Path(spec.origin).parent if spec and spec.origin else None


def _numba_sources(pkg: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        b = p.read_bytes()
        if b"numba" in b:
            out[str(p.relative_to(pkg))] = b
    return out


def numba_cache_dir(py_file: Path, env: dict | None = None) -> Path:
    """Where numba keeps the compiled cache of a source file (NUMBA_CACHE_DIR, else __pycache__)."""
    env = os.environ if env is None else env
    if env.get("NUMBA_CACHE_DIR"):
        from numba.core.caching import UserProvidedCacheLocator
        return Path(env["NUMBA_CACHE_DIR"]) / UserProvidedCacheLocator.get_suitable_cache_subpath(str(py_file))
    return py_file.parent / "__pycache__"


def reuse_numba_cache(head_pkg: Path, base_pkg: Path, env: dict | None = None) -> str | None:
    """Copy the head's compiled numba cache to the base when every numba source file is
    byte-identical (numba keys its cache on the source's contents, and the compiled code of
    identical sources is identical); returns what was done, or None when the base must compile."""
    head, base = _numba_sources(head_pkg), _numba_sources(base_pkg)
    if not head or head != base:
        return None
    n = 0
    for rel in head:
        src_dir = numba_cache_dir(head_pkg / rel, env)
        dst_dir = numba_cache_dir(base_pkg / rel, env)
        stem = Path(rel).stem
        files = list(src_dir.glob(f"{stem}.*.nbi")) + list(src_dir.glob(f"{stem}.*.nbc"))
        if files:
            dst_dir.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, dst_dir / f.name)
            n += 1
    if n == 0:
        return None
    return f"numba sources identical to the head's: {n} compiled cache files reused"
