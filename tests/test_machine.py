"""CPU contention during a measurement: the share of the machine other processes took."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from epmci.perf import machine

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat")


def test_contention_counts_others_and_not_our_own_children(monkeypatch):
    clock = {"busy": 100.0, "own": 5.0, "t": 0.0}
    monkeypatch.setattr(machine, "_busy_cpu_seconds", lambda: clock["busy"])
    monkeypatch.setattr(machine, "_own_cpu_seconds", lambda: clock["own"])
    monkeypatch.setattr(machine.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 4)
    with machine.CpuContention() as c:
        # 10 s of wall time on 4 CPUs; the machine was busy for 25 CPU-s, 15 of them ours
        clock.update(busy=125.0, own=20.0, t=10.0)
    assert c.other_pct == 25.0        # 10 CPU-s of 40
    with machine.CpuContention() as c:
        clock.update(busy=130.0, own=30.0, t=12.0)   # all of it ours
    assert c.other_pct == 0.0


def test_a_spinning_neighbour_is_seen():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with machine.CpuContention() as c:
            time.sleep(1.5)
    finally:
        spinner.kill()
        spinner.wait()
    # one busy CPU of cpu_count; other tests running alongside only add to it
    assert c.other_pct is not None and c.other_pct >= 0.6 * 100 / (os.cpu_count() or 1)
