"""The CPU peak-memory trackers against an allocation of known size: a buffer allocated, touched and
freed between ``begin()`` and ``growth()`` must show as a peak of about its size (the capacity
search, the throughput figures and docs/kernels.md rest on these numbers)."""

import time

import pytest
import torch

from core.bench.memory import RssHwmPeak, RssSampledPeak

SIZE = 256 << 20  # bytes: far above the noise of the interpreter and the allocator


def allocate_and_free(hold_s: float) -> None:
    buffer = torch.ones(SIZE // 4, dtype=torch.float32)  # touched: every page resident
    assert buffer[-1].item() == 1.0
    time.sleep(hold_s)  # the sampling tracker needs the peak to last a few samples
    del buffer


TRACKERS = [pytest.param(RssHwmPeak, marks=pytest.mark.skipif(not RssHwmPeak.available(),
                                                              reason="needs /proc/self/clear_refs (Linux)")),
            RssSampledPeak]


@pytest.mark.parametrize("tracker_type", TRACKERS)
def test_a_freed_buffer_shows_as_its_peak(tracker_type):
    tracker = tracker_type()
    try:
        tracker.begin()
        assert abs(tracker.growth()) < 32 << 20  # nothing allocated yet
        allocate_and_free(hold_s=0.05)
        grown = tracker.growth()
        assert 0.95 * SIZE <= grown <= SIZE + (32 << 20), grown
        tracker.begin()  # a new phase: the earlier peak is forgotten
        assert tracker.growth() < 0.5 * SIZE
    finally:
        tracker.close()
