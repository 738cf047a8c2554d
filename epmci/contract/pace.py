"""The gate's side of the pacing protocol (docs/engine-contract.md, Pacing): an engine started
with `--pace-fds R,W` says `ready` after its prefill, then holds every decode step until epmci
writes one byte to R, and reports the step's wall and CPU time as one JSON line on W.

`PacedEngine` starts one such run and steps it. Every read from the engine has a deadline
(the run's timeout). An engine that does not answer in time, answers anything but the
protocol, or exits before its last step is killed and raises PaceError with the reason and
its stderr. One that exits 2 before saying `ready` did not take the flag (an engine without
pacing, or an older bundled engine): PaceUnsupported, so the caller can measure without pacing.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path

from .process import EngineCommand, EngineRun
from .runspec import RunSpec, start

MAX_LINE = 4096          # a report is ~100 bytes; more without a newline is not the protocol
EXIT_GRACE_S = 10.0      # after the channel closed: how long the exit (and its code) may take
# A step cannot take longer than the round trip that contains it (both clocks are monotonic);
# the slack covers clocks that tick at slightly different rates and rounding.
RTT_SLACK = (1.01, 1e-3)


class PaceError(Exception):
    """The paced run failed; `run` is the killed engine's run (stderr tail, command line)."""

    def __init__(self, reason: str, run: EngineRun | None = None):
        super().__init__(reason)
        self.reason, self.run = reason, run


class PaceUnsupported(PaceError):
    """The engine exited 2 before `ready`: it does not take --pace-fds."""


@dataclass(frozen=True)
class StepReport:
    step: int          # 1, 2, ... in the run
    wall_s: float      # the engine's wall time of the step
    cpu_s: float       # user + system CPU time of the engine process (all threads) in the step
    rtt_s: float       # epmci's time from sending the byte to reading the report


def _positive(rec: dict, key: str) -> float | None:
    """rec[key] as a number > 0 (a decode step takes time; its log-ratio needs it), else None."""
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


class PacedEngine:
    def __init__(self, engine: EngineCommand, model: str | os.PathLike, spec: RunSpec, out: Path, *,
                 timeout: float, label: str, env: dict | None = None, cwd: str | os.PathLike | None = None,
                 cpus: frozenset[int] | None = None):
        self.label, self.timeout = label, timeout
        out.mkdir(parents=True, exist_ok=True)
        engine_r, self._to_engine = os.pipe()
        self._from_engine, engine_w = os.pipe()
        try:
            self.proc = start(engine, model, spec, out, pace_fds=(engine_r, engine_w), timeout=timeout,
                              label=label, env=env, cwd=cwd or out, cpus=cpus)
        finally:
            os.close(engine_r)
            os.close(engine_w)
        self.deadline = time.monotonic() + timeout
        self._buf = b""
        self.steps: list[StepReport] = []
        self.is_ready = False
        self.ended = False
        if self.proc.launch_error:
            self._fail(f"engine could not be started: {self.proc.launch_error}")

    # ------------------------------------------------------------ protocol

    def wait_ready(self) -> None:
        """Block until the engine finished its prefill (`ready`), or ended without a decode step."""
        rec = self._read("before its first decode step")
        if rec.get("event") == "ready" and len(rec) == 1:
            self.is_ready = True
        elif rec.get("event") == "end":
            self._end(rec)
        else:
            self._garbage(rec, "a `ready` line")

    def step(self) -> StepReport | None:
        """Let the engine run one decode step; its report, or None when it had no step left."""
        if self.ended:
            return None
        k = len(self.steps) + 1
        t0 = time.perf_counter()
        try:
            os.write(self._to_engine, b"s")
        except BrokenPipeError:
            pass        # it exited: its `end` line (or the lack of one) says whether that was fine
        rec = self._read(f"at decode step {k}")
        rtt = time.perf_counter() - t0
        if rec.get("event") == "end":
            self._end(rec)
            return None
        wall, cpu = _positive(rec, "wall_s"), _positive(rec, "cpu_s")
        if rec.get("event") != "step" or rec.get("step") != k or wall is None or cpu is None:
            self._garbage(rec, f"a `step` line for step {k} with wall_s and cpu_s > 0")
        if wall > rtt * RTT_SLACK[0] + RTT_SLACK[1]:
            self._fail(f"reported decode step {k} as {wall:.6f} s, but it was answered {rtt:.6f} s after "
                       f"its byte was sent: not a time of that step")
        report = StepReport(k, wall, cpu, rtt)
        self.steps.append(report)
        return report

    def finish(self) -> EngineRun:
        """After `end`: wait for the exit (the rest of the run's timeout) and close the channel."""
        run = self.proc.finish(self.deadline - time.monotonic())
        self._close()
        return run

    def kill(self) -> EngineRun:
        self.proc.kill()
        run = self.proc.finish(0)
        self._close()
        return run

    # ------------------------------------------------------------ reading

    def _read(self, when: str) -> dict:
        while b"\n" not in self._buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._fail(f"no answer {when} within the run's timeout of {self.timeout:g} s (killed)")
            ready, _, _ = select.select([self._from_engine], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_engine, MAX_LINE)
            if not chunk:
                self._exited(when)
            self._buf += chunk
            if b"\n" not in self._buf and len(self._buf) > MAX_LINE:
                self._fail(f"answered {len(self._buf)} bytes without a newline {when}: not the protocol")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self._fail(f"answered {line[:80]!r} {when}: not a JSON line")
        if not isinstance(rec, dict):
            self._fail(f"answered {line[:80]!r} {when}: not a JSON object")
        return rec

    def _end(self, rec: dict) -> None:
        if rec.get("steps") != len(self.steps) or isinstance(rec.get("steps"), bool):
            self._garbage(rec, f"an `end` line with steps = {len(self.steps)}")
        self.ended = True

    def _garbage(self, rec: dict, wanted: str) -> None:
        self._fail(f"answered {json.dumps(rec)[:120]} where the protocol wants {wanted}")

    def _exited(self, when: str) -> None:
        """The engine closed its end of the channel: it exited (or will)."""
        run = self.proc.finish(min(EXIT_GRACE_S, max(0.0, self.deadline - time.monotonic())))
        self._close()
        rc = run.returncode
        if rc == 2 and not self.is_ready:
            raise PaceUnsupported(f"exit 2 before `ready`: {run.failure()}", run)
        how = run.failure() or f"exit {rc}"
        raise PaceError(f"exited {when}: {how}", run)

    def _fail(self, reason: str) -> None:
        raise PaceError(reason, self.kill())

    def _close(self) -> None:
        for fd in (self._to_engine, self._from_engine):
            try:
                os.close(fd)
            except OSError:
                pass
        self._to_engine = self._from_engine = -1
