"""The reference's memoized forwards (epmci/check/reference_runs.py) are shared by every check
on the machine: parallel checks and pytest workers write and prune the same cache at once,
and none of them may stop with an internal error because another one got there first; an
unreadable entry is recomputed, not trusted."""

from __future__ import annotations

import os
import threading

import numpy as np

from epmci.check.reference_runs import whole_model
from epmci.fsutil import keep_newest
from epmci.gguf.file import ModelFile


def test_concurrent_pruners_keep_the_newest_files_and_never_fail(tmp_path):
    # one round lets the race go unnoticed about half the time (the old pruner, measured): ten do not
    for round_ in range(10):
        cache = tmp_path / str(round_)
        cache.mkdir()
        files = []
        for i in range(400):
            p = cache / f"{i:04d}.npz"
            p.write_bytes(b"x")
            os.utime(p, (1_000_000 + i, 1_000_000 + i))
            files.append(p)
        (cache / "other.json").write_text("{}")          # not the pattern: left alone
        start, errors = threading.Barrier(8), []

        def prune():
            start.wait()
            try:
                keep_newest(cache, "*.npz", 5)
            except Exception as e:                         # what a check would report as an internal error
                errors.append(e)

        threads = [threading.Thread(target=prune) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(p.name for p in cache.iterdir()) == [p.name for p in files[-5:]] + ["other.json"]


def test_an_unreadable_cached_forward_is_recomputed(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv("EPMCI_CACHE_DIR", str(tmp_path))
    mf, tokens = ModelFile(tiny_model), np.array([1, 5, 9, 2], dtype=np.int32)
    first = whole_model(mf, "sha-of-tiny", tokens)
    (entry,) = (tmp_path / "reference").glob("*.npz")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])   # cut short: not a zip any more
    again = whole_model(mf, "sha-of-tiny", tokens)
    assert np.array_equal(again.logits, first.logits) and np.array_equal(again.moe_in, first.moe_in)
    with np.load(entry) as z:                              # and the entry was written whole again
        assert np.array_equal(z["logits"], first.logits)
