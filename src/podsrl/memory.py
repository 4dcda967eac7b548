"""Peak memory of one phase: CUDA's allocator peak on a GPU; on Linux CPUs the process's peak
resident set (VmHWM), reset at the start of the phase through /proc/self/clear_refs, after
glibc has returned the heap memory it keeps from earlier phases (``malloc_trim``): otherwise the
resident set counts blocks that were freed but not given back, more or less of them depending
on what ran before."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _rss_kib(field: str) -> int | None:
    try:
        match = re.search(rf"{field}:\s+(\d+)", _STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: give freed heap memory back to the system (a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """``with PeakMemory(device) as mem: ...`` then ``mem.peak_mb`` (absolute peak during the
    block) and ``mem.delta_mb`` (peak above the level at entry). NaN where unmeasurable."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.peak_mb = self.delta_mb = float("nan")

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            trim_heap()
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
                self._start = (_rss_kib("VmRSS") or 0) / 1024
            except OSError:
                self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._start is not None and (hwm := _rss_kib("VmHWM")) is not None:
            self.peak_mb = hwm / 1024
        if self._start is not None:
            self.delta_mb = self.peak_mb - self._start
