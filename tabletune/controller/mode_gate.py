"""Which of two ways to decide a step serves more, measured on the running engine: an online A/B test.

The per-request controller can plan each row on the n-gram lookup of the step's own positions (``ROWS``), which it
can only do after the last step's read-back, or take the batch controller's one k (``BATCH``), which an engine
decides while the last step still runs (launched ahead, as vLLM's async scheduling does). Which serves more
depends on what the lookup buys on this traffic against the host time its plan costs between steps, and on the
model's errors: on chat the lookup rarely pays for that time, on code it buys a third more. The gate measures
it instead of modelling it.

Rule. Time runs in windows of ``window_steps`` steps of one mode. A window's rate is its tokens over its wall time
(the span from its first step's end to its last step's end: the first step, which may follow a switch, only starts
the clock, and host time and bookkeeping between steps are in the span; the prefills of admissions are not: either
mode prefills the same requests, and a closed loop admits in bursts that would land in one window of a pair),
divided by the speed of no speculation at each step's batch size, b / T(b, 0) (a step of the other mode, decided
before a switch, counts in neither):

    r = sum_i tokens_i / sum_i ((span_i - prefill_i) * b_i / T(b_i, 0))

A pair is a window of one mode next to a window of the other; its difference d = r_rows / r_batch - 1. The gate
keeps D, the mean of the pairs' d with weights that decay by ``memory`` a pair, and runs ``ROWS`` while D > 0.

* Trial: at the start and after a workload shift, the modes alternate for ``trial_pairs`` pairs, or until |D|
  reaches ``decisive`` after a pair: each of the trial's windows of the losing mode costs about |D| / (1 + |D|) of
  its throughput, half of it where the n-gram chain doubles the rows' rate (code-edit, D = 1).
* Then the better mode runs, and the other gets one probe window every
  n = clip(|D| / probe_cost, min_interval, max_interval) windows, paired with the window before it: probing a
  mode that loses by |D| costs about ``probe_cost`` of the throughput, and a gap the trial mis-measured is
  found again.

Noise: on a window of 32 steps at b = 8 (chat, about 17 tokens a step), the tokens of a step vary by about 20%,
so a window's rate by 20% / sqrt(31) = 3.6% and a pair's d by sqrt(2) 3.6% = 5.1%. The four trial pairs, weighted
1, 0.7, 0.49, 0.34, are worth (sum w)^2 / sum w^2 = 3.5 pairs, so D has a standard deviation of 2.7%: a mode that
loses by 5% is chosen in P(Z > 5 / 2.7) = 3.4% of trials, and the probes that follow correct it; two modes within
2% of each other are worth either. (Simulated at chat 8 on the H100 grid's inputs, 30 pairs over two
seeds: pairs' d vary by 2.8%; with the prefills in the spans, 6.0%, bursts of admissions giving pairs of -15%
and +8%.) A trial ends early on one pair of d >= 0.25 where the truth is D = -5% in
P(Z > 0.30 / 0.051) < 1e-8 of trials at that noise. At b = 1 a step's tokens vary by 50-80% (49-55% on chat
at k = 2-3 with the grid's measured rates, more on the n-gram chain's runs), a pair's d by 13-20%: at worst in
P(Z > 0.30 / 0.20) = 7% of looks, and the probes, one window in 0.25 / 0.005 = 50, correct it within about 70
windows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tabletune.errors import InputError

ROWS = 0  # per-row plans on the step's own n-gram lookup (decided after the read-back)
BATCH = 1  # the batch controller's k (decided ahead)
KEPT_PAIRS = 64  # the pairs kept to read back (D is kept apart): a gate serving for days stays this size


@dataclass(frozen=True)
class GateConfig:
    window_steps: int = 32  # steps a window of one mode
    trial_pairs: int = 4  # alternating pairs before the first choice, and after a workload shift
    probe_cost: float = 0.005  # the share of throughput probing the losing mode may cost
    min_interval: int = 4  # windows of the better mode between probes, at least
    max_interval: int = 256  # and at most
    memory: float = 0.7  # the weight a pair's difference keeps per newer pair
    decisive: float = 0.25  # |D| after a trial pair that ends the trial early

    def __post_init__(self) -> None:
        checks = [("window_steps", self.window_steps, self.window_steps >= 2, "must be >= 2"),
                  ("trial_pairs", self.trial_pairs, self.trial_pairs >= 1, "must be >= 1"),
                  ("probe_cost", self.probe_cost, self.probe_cost > 0, "must be > 0"),
                  ("min_interval", self.min_interval, self.min_interval >= 1, "must be >= 1"),
                  ("max_interval", self.max_interval, self.max_interval >= self.min_interval,
                   "must be >= min_interval"),
                  ("memory", self.memory, 0 <= self.memory < 1, "must lie in [0, 1)"),
                  ("decisive", self.decisive, self.decisive > 0, "must be > 0")]
        for name, value, ok, why in checks:
            if not ok:
                raise InputError("--policy", f"gate {name}", value, why)


@dataclass(frozen=True)
class Pair:
    """One measured pair: the two windows' normalised rates."""

    rows: float
    batch: float

    @property
    def difference(self) -> float:
        """d = r_rows / r_batch - 1."""
        return self.rows / self.batch - 1.0


def probe_interval(gap: float, cfg: GateConfig) -> int:
    """Windows of the better mode between probes: |D| / probe_cost, within [min_interval, max_interval]."""
    return int(round(min(max(abs(gap) / cfg.probe_cost, cfg.min_interval), cfg.max_interval)))


class ModeGate:
    """The A/B test of the module docstring. ``mode`` is the mode of the next step to decide; ``observe`` takes each
    step in step order, with the mode it ran in."""

    def __init__(self, cfg: GateConfig | None = None) -> None:
        self.cfg = cfg or GateConfig()
        self.shift()

    def shift(self) -> None:
        """Start (or, on a new workload, start again): the trial."""
        self.mode = ROWS
        self.trial_left = self.cfg.trial_pairs  # pairs still to run in the trial
        self.gap = 0.0  # D
        self.pairs: deque[Pair] = deque(maxlen=KEPT_PAIRS)  # the last ones since the trial began
        self.num_pairs = 0  # all of them
        self._weight = 0.0
        self._waiting = 0  # windows of the better mode still to run before the next probe
        self._last: tuple[int, float] | None = None  # the last complete window: (mode, rate)
        self._in_window: int | None = None  # the open window's mode (None: none open)
        self._steps = 0  # its steps counted
        self._tokens = 0.0
        self._norm = 0.0  # sum of span_ms * b / T(b, 0)
        self._end_s = 0.0  # the end of its last step

    def observe(self, mode: int, tokens: int, end_s: float, speed_off: float, prefill_s: float = 0.0) -> None:
        """One step that ran in ``mode``: its tokens, its end (s, the clock of the steps' starts), b / T(b, 0)
        at its batch size (tokens per ms without speculation), and the prefills (s) inside its span, left out. A
        window's first step only starts its clock; a step of another mode than the window's (decided before a
        switch) is not counted."""
        if self._in_window is None:
            if mode == self.mode:
                self._in_window, self._steps, self._tokens, self._norm = mode, 0, 0.0, 0.0
                self._end_s = end_s
            return
        if mode != self._in_window:  # neither its tokens nor its time
            self._end_s = end_s
            return
        self._steps += 1
        self._tokens += tokens
        self._norm += max(end_s - self._end_s - prefill_s, 0.0) * 1e3 * speed_off
        self._end_s = end_s
        if self._steps + 1 >= self.cfg.window_steps:
            self._in_window = None
            self._close(mode, self._tokens / self._norm if self._norm > 0 else 0.0)

    def _close(self, mode: int, rate: float) -> None:
        last, self._last = self._last, (mode, rate)
        if self.trial_left > 0:
            if last is not None and last[0] == ROWS and mode == BATCH:
                self._add(Pair(last[1], rate))
                self.trial_left = 0 if abs(self.gap) >= self.cfg.decisive else self.trial_left - 1
            if self.trial_left > 0:
                self.mode = BATCH if mode == ROWS else ROWS
            else:
                self._choose()
            return
        better = ROWS if self.gap > 0 else BATCH
        if mode != better:  # a probe, paired with the window before it
            if last is not None and last[0] == better:
                self._add(Pair(rate, last[1]) if mode == ROWS else Pair(last[1], rate))
            self._choose()
            return
        self._waiting -= 1
        if self._waiting <= 0:
            self.mode = BATCH if better == ROWS else ROWS

    def _add(self, pair: Pair) -> None:
        """D: the decayed mean of the pairs' differences."""
        self.pairs.append(pair)
        self.num_pairs += 1
        self._weight = self.cfg.memory * self._weight + 1.0
        self.gap += (pair.difference - self.gap) / self._weight

    def _choose(self) -> None:
        self.mode = ROWS if self.gap > 0 else BATCH
        self._waiting = probe_interval(self.gap, self.cfg)
