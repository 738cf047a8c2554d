"""Run an engine as a subprocess through docs/engine-contract.md, always with a timeout.

The engine is a command line: the bundled engine is `python -m engine` (epmci.contract.bundled);
`--engine-cmd` (or engine.cmd in epmci.yaml) names any binary that speaks the contract. The
inherited SDQ_* environment is dropped so a developer's shell cannot change what a check runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cgroups import cgroup_memory_limit_gib, meminfo_mib, oom_kills
from ..errors import InputError
from ..units import MiB
from . import bundled
from .outputs import engine_error_line, slot_errors, stats_fields

STDERR_TAIL_LINES = 30
STDERR_TAIL_CHARS = 4000
MAX_OUTPUT_MB = 64.0      # engine.max_output_mb: stdout + stderr an engine run may write
MAX_DISK_MB = 8192.0      # engine.max_disk_mb: what one run may put in its output directory
DISK_POLL_S = 0.2
# Contract v1 had no capability declaration and made these features mandatory: an engine whose
# features were never asked (e.g. an old base engine of --perf-base) is driven as v1 drove it.
V1_FEATURES = frozenset({"pager", "selftest", "moe_dump", "profile"})
# In every engine run's environment, one value per run: a process that left the run's session
# (a double fork into a new one) still carries it, and is found and killed with the run.
RUN_TAG = "EPMCI_RUN"


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    bundled: bool
    env: tuple[tuple[str, str], ...] = ()
    root: str | None = None      # bundled engine: the source tree it runs from (None: the installed one)
    features: frozenset[str] | None = None   # what it declared (epmci.contract.capabilities); None: v1
    max_output_mb: float = MAX_OUTPUT_MB     # a run writing more to stdout + stderr is killed
    max_disk_mb: float = MAX_DISK_MB         # a run putting more in its output directory is killed

    @classmethod
    def from_setting(cls, cmd: str | list[str] | None, env: dict | None = None) -> "EngineCommand":
        """None -> the bundled engine; a string is shlex-split; a list is taken as is."""
        env_t = tuple(sorted((env or {}).items()))
        if cmd is None:
            return cls(bundled.ARGV, True, env_t)
        argv = shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]
        if not argv:
            raise InputError("engine command", "empty")
        return cls(tuple(argv), False, env_t)

    @classmethod
    def of_settings(cls, engine_cfg, cmd: str | list[str] | None = None) -> "EngineCommand":
        """The engine of the settings' `engine` section (or `cmd` run with them), with its limits."""
        c = cls.from_setting(engine_cfg.cmd if cmd is None else cmd, engine_cfg.env)
        return dataclasses.replace(c, max_output_mb=float(engine_cfg.max_output_mb),
                                   max_disk_mb=float(engine_cfg.max_disk_mb))

    def at(self, root: str | os.PathLike) -> "EngineCommand":
        """The bundled engine of another source tree (a git worktree of --perf-base), whose
        features are not this tree's."""
        return EngineCommand(self.argv, self.bundled, self.env, str(root), max_output_mb=self.max_output_mb,
                             max_disk_mb=self.max_disk_mb)

    def with_features(self, features) -> "EngineCommand":
        return dataclasses.replace(self, features=frozenset(features))

    def has(self, feature: str) -> bool:
        return feature in (V1_FEATURES if self.features is None else self.features)

    def stats_fields(self) -> tuple[str, ...]:
        """The stats fields its every record must have."""
        return stats_fields(self.has("pager"))

    def describe(self) -> str:
        if self.bundled:
            return "bundled engine (python -m engine)" + (f" at {self.root}" if self.root else "")
        return shlex.join(self.argv)


@dataclass
class EngineRun:
    label: str
    argv: list[str]
    env_extra: dict[str, str]
    returncode: int | None
    stdout: bytes
    stderr: str
    seconds: float
    timeout: float
    timed_out: bool = False
    launch_error: str | None = None
    broken_promises: list[str] = field(default_factory=list)   # resource promises of its stats (promises.py)
    over_limit: str | None = None     # a limit of epmci's it broke (killed for it), named
    left_running: int = 0             # processes of the run still running after it exited (killed)
    oom_killed: bool = False          # died of SIGKILL as the OOM killer struck in epmci's memory cgroups

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and self.launch_error is None
                and not self.broken_promises and not self.over_limit and not self.left_running)

    @property
    def slot_errors(self) -> list[str]:
        return slot_errors(self.stderr)

    def failure(self) -> str | None:
        """Why the run did not succeed, in one line; None if it exited 0."""
        if self.launch_error:
            return f"engine could not be started: {self.launch_error}"
        if self.over_limit:
            return f"engine killed: {self.over_limit}"
        if self.left_running:
            return (f"engine exited (exit {self.returncode}) but left {self.left_running} process(es) of its own "
                    f"running (killed): an engine run must end with everything it started")
        if self.timed_out:
            return f"engine timed out after {self.timeout:g} s (killed)"
        if self.oom_killed:
            limit = cgroup_memory_limit_gib()
            cap = f"cap {limit * 1024:,.0f} MiB" if limit is not None else \
                f"no cgroup cap, the machine's {meminfo_mib('MemTotal') or 0:,.0f} MiB"
            return f"engine killed: out of memory ({cap})"
        if self.returncode == 0:
            if not self.broken_promises:
                return None
            more = f" (and {len(self.broken_promises) - 1} more)" if len(self.broken_promises) > 1 else ""
            return (f"engine broke a resource promise (docs/engine-contract.md, Paging): "
                    f"{self.broken_promises[0]}{more}")
        if self.returncode == 2:
            line = engine_error_line(self.stderr) or _last_line(self.stderr) or "no message"
            return f"engine refused to run (exit 2): {line}"
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"engine crashed ({name})"
        return f"engine crashed (exit {rc}): {_last_line(self.stderr) or 'no message'}"

    def stderr_tail(self) -> str:
        return tail(self.stderr)

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_extra.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


def tail(text: str, lines: int = STDERR_TAIL_LINES, chars: int = STDERR_TAIL_CHARS) -> str:
    t = "\n".join(text.rstrip().splitlines()[-lines:])
    return t[-chars:]


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ without SDQ_* (engine knobs), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDQ_")}
    env.update(extra or {})
    return env


def _launch(cmd: EngineCommand, args: list[str], env: dict[str, str] | None
            ) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """argv, the environment added to epmci's (reported with a failure) and the full one,
    which carries the run's own RUN_TAG."""
    argv = [*cmd.argv, *[str(a) for a in args]]
    extra = bundled.run_env(cmd.root) if cmd.bundled else {}
    extra.update(cmd.env)
    extra.update(env or {})
    return argv, extra, {**base_env(extra), RUN_TAG: f"{os.getpid()}.{next(_run_numbers)}"}


_running: dict[int, tuple[str, float]] = {}     # id -> (label, start): the engine runs going now
_running_lock = threading.Lock()
_live: set[subprocess.Popen] = set()             # every engine started and not yet reaped
_tag_of: dict[subprocess.Popen, bytes] = {}      # each engine's RUN_TAG=value, as /proc shows it
_run_numbers = itertools.count()
_stopping = False                                # kill_all ran: epmci is exiting


def _started(p: subprocess.Popen, env: dict[str, str]) -> subprocess.Popen:
    with _running_lock:
        _live.add(p)
        _tag_of[p] = f"{RUN_TAG}={env[RUN_TAG]}".encode()
        late = _stopping
    if late:       # a worker thread started it after kill_all, before epmci exited
        _kill_group(p)
    return p


def _reaped(p: subprocess.Popen) -> None:
    with _running_lock:
        _live.discard(p)
        _tag_of.pop(p, None)


def kill_all() -> int:
    """Kill every engine still running and whatever each started (each leads its own
    session, so a signal to epmci does not reach them): what an epmci that is itself being
    stopped must do last, or its engines outlive it. The number killed."""
    global _stopping
    with _running_lock:
        _stopping = True
        live = [p for p in _live if p.poll() is None]
    for p in live:
        _kill_group(p)
    return len(live)


def running() -> list[tuple[str, float]]:
    """(label, seconds so far) of every engine run going now, longest first (for progress)."""
    now = time.perf_counter()
    with _running_lock:
        return sorted(((label, now - t0) for label, t0 in _running.values()), key=lambda x: -x[1])


def run_engine(cmd: EngineCommand, args: list[str], *, timeout: float, label: str = "",
               env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
               out_dir: str | os.PathLike | None = None) -> EngineRun:
    """Run `cmd args` with the contract's environment (plus, for the bundled engine of
    another source tree, that tree on PYTHONPATH); never raises for engine failures. With
    `out_dir` (where the run's output files go) the disk it takes there is bounded too."""
    argv, extra, full_env = _launch(cmd, args, env)
    t0, oom_before = time.perf_counter(), oom_kills()
    try:
        p = _started(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=full_env, cwd=cwd, start_new_session=True), full_env)
    except OSError as e:
        return EngineRun(label, argv, extra, None, b"", "", time.perf_counter() - t0, timeout,
                         launch_error=f"{type(e).__name__}: {e}")
    key = id(p)
    with _running_lock:
        _running[key] = (label or shlex.join(argv[-3:]), t0)
    captured = _Capture(p, int(cmd.max_output_mb * MiB))
    disk = _DiskWatch(out_dir, int(cmd.max_disk_mb * MiB), captured.wake) if out_dir else None
    timed_out = False
    try:
        exited = _exit_event(p, captured.wake)     # woken by the exit or a limit, first come
        timed_out = not captured.wake.wait(timeout)
        left = len(_run_pids(p)) if exited.is_set() else 0
        _kill_group(p)          # the engine if still going, and anything of its session left behind
        p.wait()
    except BaseException:
        _kill_group(p)
        p.wait()
        raise
    finally:
        out, err = captured.close()
        if disk:
            disk.stop()
        _reaped(p)
        with _running_lock:
            _running.pop(key, None)
    over = (f"it wrote more than {cmd.max_output_mb:g} MiB to stdout and stderr (engine.max_output_mb)"
            if captured.over.is_set() else
            f"it put more than {cmd.max_disk_mb:g} MiB in its output directory (engine.max_disk_mb)"
            if disk and disk.over.is_set() else None)
    return EngineRun(label, argv, extra, p.returncode, out, err.decode("utf-8", "replace"),
                     time.perf_counter() - t0, timeout, timed_out and not over, over_limit=over,
                     left_running=0 if over or timed_out else left,
                     oom_killed=_killed_for_memory(p.returncode, oom_before, timed_out or over))


def _killed_for_memory(returncode: int | None, oom_before: int, we_killed_it) -> bool:
    """Whether a run that died of SIGKILL epmci did not send was the OOM killer's: the
    count of its kills in epmci's memory cgroups rose during the run (engines run in
    epmci's cgroup, so a cap on the job is a cap on them)."""
    return returncode == -signal.SIGKILL and not we_killed_it and oom_kills() > oom_before


def disk_bytes(path: str | os.PathLike) -> int:
    """Bytes of disk the files under `path` take (allocated blocks: a sparse file takes
    what it wrote, not its length)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


class _DiskWatch:
    """Polls the disk an engine run's output directory takes; past `limit` bytes sets
    `over` and `wake` (the caller kills the engine): a run cannot fill the disk epmci and
    the other runs share."""

    def __init__(self, path: str | os.PathLike, limit: int, wake: threading.Event):
        self.path, self.limit, self.wake = path, limit, wake
        self.over, self.done = threading.Event(), threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.done.wait(DISK_POLL_S):
            if disk_bytes(self.path) > self.limit:
                self.over.set()
                self.wake.set()
                return

    def stop(self) -> None:
        self.done.set()


class _Capture:
    """An engine's stdout and stderr read by two threads into memory, together at most
    `limit` bytes: past it `over` is set (the caller kills the engine) and the rest is
    drained unkept, so an engine that floods its output cannot exhaust epmci's memory."""

    def __init__(self, p: subprocess.Popen, limit: int):
        self.limit, self.kept, self.over, self.wake = limit, 0, threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.bufs = [bytearray(), bytearray()]
        self.streams = [p.stdout, p.stderr]
        self.threads = [threading.Thread(target=self._drain, args=(i,), daemon=True) for i in (0, 1)]
        for t in self.threads:
            t.start()

    def _drain(self, i: int) -> None:
        try:
            while chunk := self.streams[i].read1(1 << 16):
                with self.lock:
                    if self.kept + len(chunk) > self.limit:
                        self.over.set()
                        self.wake.set()
                        continue
                    self.kept += len(chunk)
                    self.bufs[i] += chunk
        except (OSError, ValueError):
            pass

    def close(self) -> tuple[bytes, bytes]:
        """Wait for both readers (every process of the run is killed by now, so the pipes
        end), then the output kept. A pipe a process outside the run still holds (one that
        left the session and cleared its environment) is left to its daemon reader: closing
        it under a blocked read would block too."""
        for t, s in zip(self.threads, self.streams):
            t.join(5.0)
            if not t.is_alive():
                s.close()
        with self.lock:
            return bytes(self.bufs[0]), bytes(self.bufs[1])


def _exit_event(p: subprocess.Popen, *also: threading.Event) -> threading.Event:
    """An event set (with `also`) once p has exited, without reaping it (waitid WNOWAIT):
    until p.wait() reaps it, its pid -- and so its session's id -- cannot go to another
    process, so what _run_pids finds after the exit is the engine's own, never a
    process of a run started meanwhile that was given the recycled pid."""
    done = threading.Event()

    def wait() -> None:
        try:
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:     # reaped already (kill_all)
            pass
        for e in (done, *also):
            e.set()
    threading.Thread(target=wait, daemon=True).start()
    return done


def _run_pids(p: subprocess.Popen) -> list[int]:
    """The run's processes still running: those in its session (the engine leads its own),
    and those that left it but carry its RUN_TAG (a double fork into a new session; one
    that also clears its environment escapes). Zombies left out; read from /proc (none
    where there is no /proc)."""
    with _running_lock:
        tag = _tag_of.get(p)
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) <= 4 or fields[0] == "Z":
            continue
        if int(fields[3]) == p.pid or tag and tag in _environ(stat.parent):
            out.append(int(stat.parent.name))
    return out


def _environ(proc_dir: Path) -> list[bytes]:
    """A process's environment as NAME=value entries ([] when not readable: another user's)."""
    try:
        return (proc_dir / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


class StartedEngine:
    """An engine running in the background (`start_engine`), its stdout and stderr going to
    files in its output directory, so nothing it prints can block it while epmci talks to
    it over other descriptors (the pacing channel). `finish` waits for it; `kill` ends it
    and whatever it started."""

    def __init__(self, label: str, argv: list[str], extra: dict[str, str], out: Path, timeout: float,
                 max_output_mb: float = MAX_OUTPUT_MB, max_disk_mb: float = MAX_DISK_MB):
        self.label, self.argv, self.extra, self.timeout = label, argv, extra, timeout
        self.out = out
        self.stdout_path, self.stderr_path = out / "engine.stdout", out / "engine.stderr"
        self.proc: subprocess.Popen | None = None
        self.launch_error: str | None = None
        self.max_output_mb, self.over_limit = max_output_mb, False
        self.max_disk_mb, self.over_disk, self.polls = max_disk_mb, False, 0
        self.exited = threading.Event()       # set at the exit, before the engine is reaped
        self.t0, self.oom_before = time.perf_counter(), oom_kills()
        self.killed = False                   # by epmci (kill), not by the kernel

    def watch(self) -> None:
        """Kill the engine once its output files hold more than max_output_mb (polled every
        50 ms: its output goes to files, so a flood would fill the disk, not epmci's memory)."""
        def run() -> None:
            while not self.exited.wait(0.05):
                if self._output_over(every=20):
                    _kill_group(self.proc)      # finish() reaps it
                    return
        self.exited = _exit_event(self.proc)
        threading.Thread(target=run, daemon=True).start()

    def _output_over(self, every: int = 1) -> bool:
        """Over a limit: stdout + stderr at every call, the output directory's disk at every
        `every`-th (walking it costs epmci CPU time beside a timed engine)."""
        size = sum(p.stat().st_size for p in (self.stdout_path, self.stderr_path) if p.exists())
        self.over_limit = self.over_limit or size > self.max_output_mb * MiB
        self.polls += 1
        if not self.over_limit and self.polls % every == 0:
            self.over_disk = self.over_disk or disk_bytes(self.out) > self.max_disk_mb * MiB
        return self.over_limit or self.over_disk

    def poll(self) -> int | None:
        """Its exit code once it has exited (reaping it: call after finish or kill)."""
        return self.proc.poll() if self.proc else None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.killed = True
            _kill_group(self.proc)
            self.proc.wait()
        if self.proc:
            _reaped(self.proc)

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def finish(self, timeout: float) -> EngineRun:
        """Wait up to `timeout` s for the exit (killed after that); the run as run_engine reports it."""
        if self.proc is None:
            return EngineRun(self.label, self.argv, self.extra, None, b"", "", 0.0, self.timeout,
                             launch_error=self.launch_error)
        timed_out = not self.exited.wait(max(0.0, timeout))
        self._output_over()                 # also a flood that ended between two polls
        left = 0 if timed_out or self.over_limit or self.over_disk else len(_run_pids(self.proc))
        _kill_group(self.proc)
        self.proc.wait()
        _reaped(self.proc)
        over = (f"it wrote more than {self.max_output_mb:g} MiB to stdout and stderr (engine.max_output_mb)"
                if self.over_limit else
                f"it put more than {self.max_disk_mb:g} MiB in its output directory (engine.max_disk_mb)"
                if self.over_disk else None)
        out = b"" if self.over_limit else self.stdout_path.read_bytes() if self.stdout_path.exists() else b""
        return EngineRun(self.label, self.argv, self.extra, self.proc.returncode, out,
                         "" if self.over_limit else self.stderr_text(), time.perf_counter() - self.t0, self.timeout,
                         timed_out and not over, over_limit=over, left_running=left,
                         oom_killed=_killed_for_memory(self.proc.returncode, self.oom_before,
                                                       timed_out or over or self.killed))


def start_engine(cmd: EngineCommand, args: list[str], out: Path, *, timeout: float, label: str = "",
                 env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 pass_fds: tuple[int, ...] = (), cpus: frozenset[int] | None = None) -> StartedEngine:
    """Start `cmd args` as run_engine would, without waiting; `pass_fds` are inherited, and
    `cpus` (when given) are the only CPUs the engine and every thread it starts may run on."""
    argv, extra, full_env = _launch(cmd, args, env)
    started = StartedEngine(label, argv, extra, Path(out), timeout, cmd.max_output_mb, cmd.max_disk_mb)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None   # in the child, before exec
    try:
        with open(started.stdout_path, "wb") as so, open(started.stderr_path, "wb") as se:
            started.proc = _started(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=so, stderr=se,
                                                     env=full_env, cwd=cwd, start_new_session=True,
                                                     pass_fds=pass_fds, preexec_fn=pin), full_env)
    except OSError as e:
        started.launch_error = f"{type(e).__name__}: {e}"
    else:
        started.watch()
    return started


def _kill_group(p: subprocess.Popen) -> None:
    """Kill the engine and whatever it started: its process group, and every other process
    of the run (_run_pids: of its session, or carrying its tag)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except ProcessLookupError:
            pass
    for pid in _run_pids(p):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def drop_page_cache(path: str | os.PathLike) -> bool:
    """posix_fadvise(DONTNEED) over the whole file: its clean pages leave the page cache."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)
