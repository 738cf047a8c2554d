"""`--perf-base REF`: the engine of a git ref, measured against the working tree's engine on
the same machine, interleaved, so slow drifts of a noisy shared runner hit both sides alike.
This module has the worktree, the build and whole-run ABBA (perf.base_mode: abba, and the
fallback of the paced comparison, epmci.perf.paced, when it cannot run).

1. The ref is checked out into a temporary worktree (`git worktree add --detach`), always
   removed afterwards (`git worktree remove --force`, then `git worktree prune`).
2. Build: the bundled engine runs from the worktree (EngineCommand.at), so its own engine
   code is used. Its numba kernels are compiled by a warm-up run, unless the head's compiled
   cache can be reused (epmci.contract.bundled.reuse_numba_cache). An external engine
   (engine.cmd) runs with the worktree as cwd after engine.build_cmd ran there.
3. Runs alternate in pairs, the order flipped every pair (base-head, head-base, ...: ABBA),
   after one discarded warm-up run of each side; the model's page cache is dropped before
   every run.
4. Verdict on the paired ratios head_i / base_i (epmci.stats.compare_paired: median ratio,
   bootstrap CI, Wilcoxon signed-rank or sign test on the log-ratios): SAME / DIFFERENT /
   UNKNOWN; UNKNOWN buys two more pairs at a time up to a cap, and alpha is split over
   those looks (epmci.compare.stats.per_look_alpha) so re-testing cannot buy a false alarm. The runs decode
   perf.abba_n_predict tokens (longer than the golden scenario: steadier tok/s).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..compare.stats import UNKNOWN, Comparison, compare_paired, per_look_alpha
from ..contract import bundled
from ..contract.process import EngineCommand, EngineRun, run_engine
from ..contract.runspec import RunSpec
from ..errors import InputError
from .measure import Measurement, measure


def git(repo: str | os.PathLike, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def repo_root(start: str | os.PathLike) -> Path:
    try:
        r = git(start, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError("--perf-base", f"git is not usable: {e}") from None
    if r.returncode != 0:
        raise InputError("--perf-base", f"{start} is not inside a git repository")
    return Path(r.stdout.strip())


def resolve_ref(repo: str | os.PathLike, ref: str) -> str:
    r = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if r.returncode != 0 or not r.stdout.strip():
        raise InputError("--perf-base", f"{ref!r} is not a commit of {repo} (fetch it first?)")
    return r.stdout.strip()


class Worktree:
    """`with Worktree(repo, sha) as path:` a detached checkout of sha, removed on exit."""

    def __init__(self, repo: str | os.PathLike, sha: str):
        self.repo, self.sha = Path(repo), sha
        self.tmp: Path | None = None
        self.path: Path | None = None

    def __enter__(self) -> Path:
        self.tmp = Path(tempfile.mkdtemp(prefix="epmci-base-"))
        self.path = self.tmp / f"base-{self.sha[:12]}"
        r = git(self.repo, "worktree", "add", "--detach", str(self.path), self.sha)
        if r.returncode != 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise RuntimeError(f"git worktree add failed: {(r.stderr or r.stdout).strip()[-300:]}")
        return self.path

    def __exit__(self, *exc) -> None:
        try:
            git(self.repo, "worktree", "remove", "--force", str(self.path))
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            git(self.repo, "worktree", "prune")


# ------------------------------------------------------------------ build

# Python engines hash strings with a per-process random seed, which moves dict layouts and
# with them timings between processes; fixed, every process of a comparison hashes alike.
FIXED_ENV = {"PYTHONHASHSEED": "0"}


@dataclass
class Side:
    label: str                     # "base" | "head"
    engine: EngineCommand
    cwd: Path | None = None
    env: dict = field(default_factory=dict)

    def run_env(self) -> dict:
        """The environment of this side's runs in a comparison."""
        return {**FIXED_ENV, **self.env}


def base_side(worktree: Path, head: EngineCommand) -> Side:
    return Side("base", head.at(worktree) if head.bundled else head, worktree, {})


def build_base(side: Side, worktree: Path, head: EngineCommand, build_cmd, timeout: float) -> tuple[bool, str, EngineRun | None]:
    """Make the base runnable: reuse or leave numba compilation to the warm-up run (bundled),
    or run engine.build_cmd in the worktree (external)."""
    if head.bundled:
        pkg = bundled.installed_package()
        msg = bundled.reuse_numba_cache(pkg, worktree / "engine") if pkg else None
        return True, msg or "numba sources differ from the head's: the base compiles in its warm-up run", None
    if build_cmd is None:
        return True, "external engine: no engine.build_cmd, nothing to build", None
    argv = shlex.split(build_cmd) if isinstance(build_cmd, str) else [str(x) for x in build_cmd]
    run = run_engine(EngineCommand(tuple(argv), False, head.env), [], timeout=timeout, label="base build",
                     cwd=worktree)
    return run.ok, ("built" if run.ok else f"base build failed: {run.failure()}"), run


# ------------------------------------------------------------------ ABAB

@dataclass
class ABABResult:
    comparison: Comparison | None
    base: list[float]
    head: list[float]
    order: list[str]                       # run order, e.g. ["base", "head", "head", "base", ...]
    base_first: Measurement | None = None  # the first measured run of each side (counters, fingerprint)
    head_first: Measurement | None = None
    failure: str | None = None
    failed_run: Measurement | None = None
    seconds: float = 0.0
    alpha: float = 0.05                    # the significance level of each look

    @property
    def pairs(self) -> int:
        return len(self.head)


def run_abab(head: Side, base: Side, model: str | os.PathLike, spec: RunSpec, workdir: Path, *,
             pairs: int, max_pairs: int, alpha: float, min_effect: float, timeout: float,
             warmup: bool = True, test: str = "wilcoxon",
             progress: Callable[[str], None] | None = None) -> ABABResult:
    say = progress or (lambda s: None)
    res = ABABResult(None, [], [], [], alpha=per_look_alpha(alpha, pairs, max_pairs))

    def one(side: Side, tag: str) -> Measurement | None:
        m = measure(side.engine, model, spec, workdir / side.label, timeout=timeout, cwd=side.cwd,
                    env=side.run_env(), label=f"{side.label} {tag}")
        res.seconds += m.seconds
        if not m.ok:
            res.failure = f"{side.label} run ({tag}): {m.failure}"
            res.failed_run = m
            return None
        return m

    if warmup:
        for side in (base, head):
            if one(side, "warm-up") is None:
                return res
    while True:
        k = len(res.head)
        order = (base, head) if k % 2 == 0 else (head, base)
        got = {}
        for side in order:
            m = one(side, f"pair {k + 1}")
            if m is None:
                return res
            got[side.label] = m
            res.order.append(side.label)
            if side.label == "base" and res.base_first is None:
                res.base_first = m
            if side.label == "head" and res.head_first is None:
                res.head_first = m
        res.base.append(got["base"].tok_s)
        res.head.append(got["head"].tok_s)
        say(f"[perf-base] pair {k + 1}: base {got['base'].tok_s:.2f}, head {got['head'].tok_s:.2f} tok/s "
            f"(x{got['head'].tok_s / got['base'].tok_s:.3f})")
        if len(res.head) < pairs:
            continue
        if min(res.base + res.head) <= 0:
            res.failure = "a run reported no decode tok/s"
            return res
        res.comparison = compare_paired(res.base, res.head, res.alpha, min_effect, test)
        if res.comparison.verdict != UNKNOWN or len(res.head) + 2 > max_pairs:
            return res
        # UNKNOWN: two more pairs (one of each order) and decide again
        pairs = len(res.head) + 2
