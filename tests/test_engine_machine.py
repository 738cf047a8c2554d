"""engine/machine.py: the memory and CPUs the engine sizes itself from, read from cgroup
files laid out as cgroup v1 and v2 do."""

from __future__ import annotations

import os

import pytest

from engine import machine



def _fake_cgroups(monkeypatch, tmp_path, files: dict[str, dict[str, str]]):
    """Directories named in `files` (innermost first), each with its files' contents."""
    dirs = []
    for name, content in files.items():
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        for f, v in content.items():
            (d / f).write_text(v + "\n")
        dirs.append(d)
    monkeypatch.setattr(machine, "_cgroup_dirs", lambda controller: dirs)


def _mem_total() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.mark.parametrize("layout", [
    {"job": {"memory.limit_in_bytes": str(8 << 30)}, "": {"memory.limit_in_bytes": "9223372036854771712"}},
    {"job": {"memory.max": "max"}, "": {"memory.max": str(8 << 30)}},          # v2, the limit on a parent
])
def test_the_smallest_cgroup_limit_is_the_memory(monkeypatch, tmp_path, layout):
    _fake_cgroups(monkeypatch, tmp_path, layout)
    expected = (8 << 30, "its cgroup's memory limit") if (8 << 30) < _mem_total() else \
        (_mem_total(), "the machine's MemTotal")     # a limit above the RAM limits nothing
    assert machine.memory_limit() == expected


def test_without_a_limit_the_memory_is_mem_total(monkeypatch, tmp_path):
    _fake_cgroups(monkeypatch, tmp_path, {"job": {"memory.max": "max"}, "": {"memory.limit_in_bytes": "x"}})
    assert machine.memory_limit() == (_mem_total(), "the machine's MemTotal")


@pytest.mark.parametrize("layout, cpus", [
    ({"job": {"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"}}, 2),
    ({"job": {"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"}}, 1),
    ({"job": {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"}}, None),   # no quota
    ({"job": {"cpu.max": "max 100000"}, "": {"cpu.max": "100000 100000"}}, 1),
    ({"job": {}}, None),
])
def test_threads_are_the_cpus_capped_by_a_quota(monkeypatch, tmp_path, layout, cpus):
    _fake_cgroups(monkeypatch, tmp_path, layout)
    mask = len(os.sched_getaffinity(0))
    assert machine.usable_cpus() == (mask if cpus is None else min(mask, cpus))


def test_the_real_cgroups_of_this_process_are_read():
    limit, source = machine.memory_limit()
    assert 0 < limit <= _mem_total() and source in ("its cgroup's memory limit", "the machine's MemTotal")
    assert 1 <= machine.usable_cpus() <= len(os.sched_getaffinity(0))
