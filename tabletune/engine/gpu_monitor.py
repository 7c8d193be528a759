"""SM clock, power and temperature sampled by ``nvidia-smi`` while a benchmark runs.

A compute-bound grid cell on the H200 runs at the 700 W power limit, and the SM clock drops from 1980 MHz to
~1600 MHz there (engine notes, 0.7.dev3): the same code then measures a few percent slower on one card than on
another, or late in a grid than early. ``GpuMonitor`` keeps a background ``nvidia-smi`` loop and answers, for any
time window (``window``), the lowest and median SM clock, the highest power draw and temperature, so that a grid
records the state each row ran in. Without ``nvidia-smi`` (this machine, CI) it records nothing and says so.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime

QUERY = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu")
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's timestamp, local time


@dataclass(frozen=True)
class GpuSample:
    t_s: float  # the sample's nvidia-smi timestamp as a time.time() value
    sm_clock_mhz: float
    power_w: float
    temperature_c: float


@dataclass(frozen=True)
class GpuWindow:
    samples: int
    sm_clock_mhz_min: float
    sm_clock_mhz_median: float
    power_w_max: float
    temperature_c_max: float


def parse_smi_line(line: str) -> GpuSample | None:
    """One ``--format=csv,noheader,nounits`` line of QUERY ("2026/12/02 01:44:12.345, 1980, 537.37, 51"), or None
    for any other line (a header, "[N/A]", a message). The timestamp, not the time the line is read: a pipe may
    deliver the lines in bursts."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(QUERY):
        return None
    try:
        t_s = datetime.strptime(parts[0], TIME_FORMAT).timestamp()
        clock, power, temp = (float(p) for p in parts[1:])
    except ValueError:
        return None
    return GpuSample(t_s, clock, power, temp)


def summarize(samples: list[GpuSample]) -> GpuWindow | None:
    if not samples:
        return None
    clocks = [s.sm_clock_mhz for s in samples]
    return GpuWindow(len(samples), min(clocks), statistics.median(clocks), max(s.power_w for s in samples),
                     max(s.temperature_c for s in samples))


def smi_command(interval_ms: int = 500, gpu: int = 0) -> list[str] | None:
    """The ``nvidia-smi`` loop for GPU ``gpu``, or None when there is no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    return [exe, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits", f"-lms={interval_ms}",
            f"--id={gpu}"]


class GpuMonitor:
    """``with GpuMonitor() as mon: ...; mon.window(t0, t1)`` (time.time() values): the samples of ``command``
    (default ``smi_command()``), one a line of its output, read by a daemon thread; ``available`` is False when
    there is no command or it could not start."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command if command is not None else smi_command()
        self.samples: list[GpuSample] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._proc is not None

    def __enter__(self) -> GpuMonitor:
        if self.command:
            try:
                self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                              text=True)
            except OSError:
                self._proc = None
        if self._proc is not None:
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            sample = parse_smi_line(line)
            if sample is not None:
                with self._lock:
                    self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)

    def window(self, t0_s: float, t1_s: float) -> GpuWindow | None:
        """The samples taken between two time.time() readings."""
        with self._lock:
            return summarize([s for s in self.samples if t0_s <= s.t_s <= t1_s])
