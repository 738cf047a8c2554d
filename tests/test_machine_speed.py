"""epmci.perf.speed: the machine's own speed, and how much of a tok/s drop it explains.

The rule on known numbers (a decode step is compute plus waiting for reads, each scaled by
its own part of the machine), and the probes on the tiny model (real numbers, positive).
"""

from __future__ import annotations

import os

import pytest

from epmci.perf.speed import DISK_MIB, PROBE_NOISE, cpu_ms, disk_mib_s, explains, io_wait_share, machine_factor

THEN = {"cpu_ms": 100.0, "disk_mib_s": 1000.0}


@pytest.mark.parametrize("now,share,factor", [
    ({"cpu_ms": 100.0, "disk_mib_s": 1000.0}, 0.3, 1.0),          # the same machine
    ({"cpu_ms": 100.0, "disk_mib_s": 500.0}, 0.26, 1 / 1.26),     # disk at half speed, 26 % waiting
    ({"cpu_ms": 120.0, "disk_mib_s": 1000.0}, 0.0, 1 / 1.2),      # CPU 20 % slower, no reads
    ({"cpu_ms": 120.0, "disk_mib_s": 500.0}, 1.0, 0.5),           # all waiting: the disk alone
    ({"cpu_ms": 50.0, "disk_mib_s": 2000.0}, 0.5, 2.0),           # twice as fast
])
def test_machine_factor_weights_cpu_and_disk_by_the_read_wait_share(now, share, factor):
    f, how = machine_factor(THEN, now, share)
    assert f == pytest.approx(factor)
    assert f"predicts tok/s x{factor:.3f}" in how and f"{100 * share:.0f} % of decode" in how


def test_explained_only_within_min_effect_and_beyond_the_probes_noise():
    assert PROBE_NOISE == 0.05
    slow_disk = {"cpu_ms": 100.0, "disk_mib_s": 500.0}             # predicts x0.794 at 26 % waiting,
    ok, factor, how = explains(THEN, slow_disk, 0.26, 0.81, 0.05)  # credited x0.833 beyond the noise
    assert ok and factor == pytest.approx(1 / 1.26) and "that is x0.833" in how
    assert not explains(THEN, slow_disk, 0.26, 0.76, 0.05)[0]      # 0.76 / 0.833 = 0.91: the engine too
    assert not explains(THEN, THEN, 0.26, 0.90, 0.05)[0]           # same machine: a 10 % drop is the engine's
    # a machine slower by no more than the probes' noise is credited nothing
    noisy = {"cpu_ms": 104.0, "disk_mib_s": 1000.0}
    assert not explains(THEN, noisy, 0.26, 0.94, 0.05)[0]


def test_io_wait_share_is_the_median_over_runs():
    runs = [{"io_wait_s": 0.05, "seconds": 0.2}, {"io_wait_s": 0.1, "seconds": 0.2}, {"io_wait_s": 0.0, "seconds": 0.2}]
    assert io_wait_share(runs) == 0.25
    assert io_wait_share([{"seconds": 0.2}]) is None               # the engine does not report it
    assert io_wait_share([{"io_wait_s": 0.0, "seconds": 0.0}]) is None


def test_probes_measure_real_numbers(tiny_model):
    assert cpu_ms() > 0
    d = disk_mib_s(tiny_model, threads=2, n_reads=8)
    assert d["mb_per_s"] > 0 and d["reads"] == 8 * 3 and d["read_bytes"] > 0 and isinstance(d["o_direct"], bool)
    assert disk_mib_s(tiny_model)["read_bytes"] >= DISK_MIB * 2**20      # by volume when no count is given


@pytest.mark.parametrize("fault", ["error", "short read"])
def test_a_failed_disk_read_fails_the_probe(tiny_model, monkeypatch, fault):
    """A reader thread that fails must fail the probe, not report the speed of fewer bytes."""
    import epmci.perf.speed as S
    real = os.preadv

    def broken(fd, bufs, off):
        if fault == "error":
            raise OSError(5, "Input/output error")
        return real(fd, bufs, off) - 4096
    monkeypatch.setattr(S.os, "preadv", broken)
    with pytest.raises(OSError, match="Input/output error" if fault == "error" else "read .* of .* bytes"):
        disk_mib_s(tiny_model, threads=2, n_reads=4)
