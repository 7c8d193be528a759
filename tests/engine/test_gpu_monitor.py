"""nvidia-smi sampling (tabletune.engine.gpu_monitor): the line parser, windows, and the monitor on a fake loop."""

import sys
import time
from datetime import datetime

import pytest

from tabletune.engine.gpu_monitor import TIME_FORMAT, GpuMonitor, GpuSample, parse_smi_line, summarize


def test_parse_smi_line():
    s = parse_smi_line("2026/12/02 01:44:12.500, 1605, 695.19, 59\n")
    assert (s.sm_clock_mhz, s.power_w, s.temperature_c) == (1605.0, 695.19, 59.0)
    assert s.t_s == pytest.approx(datetime(2026, 12, 2, 1, 44, 12, 500000).timestamp())
    assert parse_smi_line("timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu") is None
    assert parse_smi_line("2026/12/02 01:44:12.500, [N/A], 695.19, 59") is None
    assert parse_smi_line("1980, 120.0, 40") is None  # a line of another query


def test_summarize():
    samples = [GpuSample(float(i), c, p, t) for i, (c, p, t) in enumerate([(1980, 120, 40), (1605, 695, 59),
                                                                           (1860, 687, 60)])]
    w = summarize(samples)
    assert (w.samples, w.sm_clock_mhz_min, w.sm_clock_mhz_median, w.power_w_max, w.temperature_c_max) == \
        (3, 1605, 1860, 695, 60)
    assert summarize([]) is None


def test_monitor_on_a_fake_loop_keeps_windows_apart():
    """A fake nvidia-smi prints three timestamped lines (one 10 s in the future) and a stray one; a window
    covering now holds the two current ones."""
    script = ("import time, datetime\n"
              f"fmt = {TIME_FORMAT!r}\n"
              "now = datetime.datetime.now()\n"
              "for dt, clock in ((0, 1980), (0, 1600), (10, 1500)):\n"
              "    print((now + datetime.timedelta(seconds=dt)).strftime(fmt) + f', {clock}, 600, 55', flush=True)\n"
              "print('No devices were found', flush=True)\n"
              "time.sleep(30)\n")
    t0 = time.time()
    with GpuMonitor([sys.executable, "-c", script]) as mon:
        assert mon.available
        deadline = time.time() + 10
        while len(mon.samples) < 3 and time.time() < deadline:
            time.sleep(0.05)
    w = mon.window(t0 - 1, time.time() + 1)
    assert (w.samples, w.sm_clock_mhz_min, w.sm_clock_mhz_median) == (2, 1600, 1790)
    assert mon.window(t0 + 5, t0 + 20).sm_clock_mhz_min == 1500


def test_monitor_without_nvidia_smi():
    with GpuMonitor([]) as mon:
        assert not mon.available
    assert mon.window(0, time.time()) is None
    with GpuMonitor(["/nonexistent/nvidia-smi"]) as mon:
        assert not mon.available
