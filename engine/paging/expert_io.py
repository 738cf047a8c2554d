"""Expert reads: a pool of reader threads moving byte ranges of the model file into memory.

The I/O threads only move bytes; they decide nothing (the cache policy decided, on the
main thread, where every read goes before it was submitted). A read of one expert is up
to three ranges (gate, up, down): with `parallel` they are three tasks that different
threads run concurrently, otherwise one task reading them one after another. `submit`
returns a ReadHandle; `wait` blocks until every range is in place and reports the time
spent waiting.

Reads start in the order of their `due` (when the computation needs them: the pager
passes (micro-batch, layer)), first come first served among equals. In plain arrival
order a layer's misses queued behind the next layer's prefetches, issued a moment
earlier, and the computation waited for reads it did not need yet.

* `os.preadv` straight into the destination (an arena slot or a transient buffer): no copy.
* O_DIRECT when the file offset, the length and the destination address are all
  multiples of 4096 and the file system accepts it (the arena's aligned windows,
  engine/paging/arena.py); the buffered descriptor otherwise.
* `fadvise_dontneed`: after each read, POSIX_FADV_DONTNEED on the range just read, so the
  page cache cannot serve the next read of the same expert.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time

DIRECT_ALIGN = 4096


class ReadHandle:
    """Completion of one expert read (one or more ranges)."""

    __slots__ = ("_left", "_lock", "_event", "error")

    def __init__(self, n_parts: int):
        self._left = n_parts
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.error: BaseException | None = None

    def _part_done(self, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self._event.set()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def wait(self) -> float:
        """Block until complete; returns seconds waited. Re-raises a read error."""
        waited = 0.0
        if not self._event.is_set():
            t0 = time.perf_counter()
            self._event.wait()
            waited = time.perf_counter() - t0
        if self.error is not None:
            raise self.error
        return waited


class ExpertIO:
    def __init__(self, path: str | os.PathLike, threads: int = 4, parallel: bool = True,
                 fadvise_dontneed: bool = False, direct: bool = True):
        self.path = str(path)
        self.parallel = parallel
        self.fadvise_dontneed = fadvise_dontneed
        self.fd = os.open(self.path, os.O_RDONLY)
        self.dfd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self.dfd = -1
        self._fds = [fd for fd in (self.fd, self.dfd) if fd >= 0]
        self._stats_lock = threading.Lock()
        self.bytes_read = 0      # every byte moved by a reader (a timing-independent total)
        self.reads_direct = 0    # ranges read with O_DIRECT
        self.reads_buffered = 0
        # branch events, counted at submit on the main thread (exact, whatever the timing):
        # expert reads one task reads range after range, ranges dropped from the page cache
        self.serial_reads = self.fadvise_ranges = 0
        self._q: queue.PriorityQueue = queue.PriorityQueue()   # (due, arrival, task)
        self._arrival = itertools.count()
        self._batch: list = []   # submitted, not yet handed to the readers (main thread only)
        self._threads = [threading.Thread(target=self._worker, name=f"epm-io-{i}", daemon=True)
                         for i in range(max(1, int(threads)))]
        for t in self._threads:
            t.start()
        self._closed = False

    # ------------------------------------------------------------ submit

    def submit(self, ranges: list[tuple[int, int, memoryview, int]], defer: bool = False,
               due: tuple[int, ...] = ()) -> ReadHandle:
        """ranges: (file offset, length, destination memoryview, destination address);
        due: when the read is needed (the queue's order; smaller first).

        defer=True holds the read back until `flush()`, so the caller can finish its
        decisions for a whole layer before reader threads wake up and compete for the CPU.
        Never wait on a deferred handle before flushing."""
        if self.parallel:
            h = ReadHandle(len(ranges))
            self._batch.extend((due, next(self._arrival), (h, (r,))) for r in ranges)
        else:
            h = ReadHandle(1)
            self._batch.append((due, next(self._arrival), (h, tuple(ranges))))
            self.serial_reads += 1
        if self.fadvise_dontneed:
            self.fadvise_ranges += len(ranges)
        if not defer:
            self.flush()
        return h

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        for item in batch:
            self._q.put(item)

    # ------------------------------------------------------------ workers

    def _worker(self) -> None:
        while True:
            _, _, task = self._q.get()
            if task is None:
                return
            h, ranges = task
            err = None
            try:
                for r in ranges:
                    self._read(*r)
            except BaseException as e:  # reported to the waiter
                err = e
            h._part_done(err)

    def _read(self, offset: int, length: int, dest: memoryview, addr: int) -> None:
        if len(dest) < length:
            raise ValueError(f"read of {length} B at {offset} into a {len(dest)} B buffer")
        use_direct = (self.dfd >= 0 and offset % DIRECT_ALIGN == 0 and length % DIRECT_ALIGN == 0
                      and addr % DIRECT_ALIGN == 0)
        if use_direct:
            try:
                self._pread_all(self.dfd, offset, length, dest)
                with self._stats_lock:
                    self.reads_direct += 1
                    self.bytes_read += length
            except OSError:
                # The file system refused O_DIRECT after all: buffered from now on.
                self.dfd = -1
                use_direct = False
        if not use_direct:
            self._pread_all(self.fd, offset, length, dest)
            with self._stats_lock:
                self.reads_buffered += 1
                self.bytes_read += length
        if self.fadvise_dontneed:
            os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)

    @staticmethod
    def _pread_all(fd: int, offset: int, length: int, dest: memoryview) -> None:
        done = 0
        while done < length:
            n = os.preadv(fd, [dest[done:length]], offset + done)
            if n <= 0:
                raise OSError(f"short read: {done} of {length} B at offset {offset}")
            done += n

    def direct_pct(self) -> float:
        """Share of the ranges read so far that went through O_DIRECT (%)."""
        with self._stats_lock:
            n = self.reads_direct + self.reads_buffered
            return round(100.0 * self.reads_direct / n, 2) if n else 0.0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush()
        for _ in self._threads:   # after every read already queued
            self._q.put(((float("inf"),), next(self._arrival), None))
        for t in self._threads:
            t.join()
        for fd in self._fds:
            os.close(fd)
