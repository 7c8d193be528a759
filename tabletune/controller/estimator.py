"""Online acceptance estimation: per-step observations, decayed censored counts, counter windows.

Censoring (the same convention as ``tabletune.acceptance.AcceptanceCounts``):
a draft of length k with m accepted tokens *reached* positions 1..min(m+1, k)
and *accepted* positions 1..m. Position j is only tested when positions < j were
accepted, so the conditional rate at j is estimated from the drafts that reached
j, never from all drafts:

    a_j = (A_j + w * m_j) / (R_j + w)

where R_j, A_j are the exponentially decayed reached/accepted counts, w the prior
weight in pseudo-drafts and m_j the prior mean at j; the prior never decays.

Decay: before each observation, R_j and A_j are multiplied by 0.5 ** (x_j / half_life),
where x_j is the number of draft tokens the observation verified *at position j*
(its reached_j; ``half_life_tokens``), or the seconds since the previous
observation (``half_life_s``). Counting verified tokens per position keeps about
half_life / ln 2 drafts of evidence at every position, also at deep positions
that only exploration steps reach: they forget as slowly as they learn.

The prior mean is *chained*: m_1 = p_1 and m_j = p_j * a_{j-1} / p_{j-1} for j >= 2,
with p the prior profile's rates. A position with little evidence thus follows
the level measured one position down, in the prior's shape, rather than a prior
measured on another workload. With no evidence anywhere, a_j = p_j.

Shift detection: slowly forgetting deep positions would stay stale after a
workload switch. A second count at position 1 decays ``FAST_RATIO`` times
faster. When the fast and slow rates there differ by more than ``SHIFT_Z``
standard errors of the fast one (and by at least ``SHIFT_MIN_DELTA``), the
workload has changed: position 1 keeps only the fast counts and deeper positions
drop their evidence, so the chained prior carries the new level to them until
drafting and exploration re-measure them.

Observations carry exact per-draft information when the engine has it
(``StepObservation.from_drafts``). Engines that only report vLLM's per-position
drafted/accepted counts (``from_vllm_counts``) lose the reached counts; they are
then rebuilt with ``reached_j = accepted_{j-1} * drafted_j / drafted_{j-1}``,
exact when every draft in the window had the same length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

LN2 = math.log(2.0)
FAST_RATIO = 8.0  # the fast position-1 estimate forgets this many times faster
SHIFT_Z = 4.0  # standard errors between fast and slow position-1 rates that signal a switch
SHIFT_MIN_DELTA = 0.05
SHIFT_MIN_EVIDENCE = 30.0  # fast drafts needed before testing


@dataclass(frozen=True)
class StepObservation:
    """What one engine step verified. Counts are per position j = 1..len(lists).

    batch_size: requests scheduled in the step; k: the draft length the step
    scheduled (vLLM's ``num_spec_tokens_to_schedule``); time_s: when (any clock).
    """

    batch_size: int
    k: int
    num_drafts: int
    reached: tuple[float, ...]
    accepted: tuple[float, ...]
    drafted: tuple[float, ...]
    time_s: float | None = None
    undrafted: float = 0.0  # request-steps that could draft (k >= 1 asked) but verified no draft

    @classmethod
    def from_drafts(cls, batch_size: int, k: int, drafts: Iterable[tuple[int, int]],
                    time_s: float | None = None, k_max: int | None = None, undrafted: float = 0.0) -> StepObservation:
        """Exact counts from (draft length, accepted length) pairs.

        drafted_j = #{k_i >= j}, accepted_j = #{m_i >= j}, reached_j = #{k_i >= j and m_i >= j-1}:
        each draft adds 1 to the "ends at" bins k_i, min(m_i + 1, k_i) and m_i; suffix sums give the counts.
        """
        drafts = list(drafts)
        n = k_max or max((d for d, _ in drafts), default=0)
        # how many drafts end at j: their length (drafted), their last tested position (reached), m (accepted)
        end_d, end_r, end_a = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
        num_drafts = 0
        for d, a in drafts:
            if d <= 0:
                continue
            if d > n:
                d = n
            if a > d:
                a = d
            num_drafts += 1
            end_d[d] += 1
            end_r[a + 1 if a < d else d] += 1
            end_a[a] += 1
        drafted, reached, accepted = (tuple(accumulate(e[:0:-1]))[::-1] for e in (end_d, end_r, end_a))
        return cls(batch_size, k, num_drafts, reached, accepted, drafted, time_s, undrafted)

    @classmethod
    def from_vllm_counts(cls, batch_size: int, k: int, num_drafts: int, drafted: Sequence[float],
                         accepted: Sequence[float], time_s: float | None = None) -> StepObservation:
        """From vLLM's per-position counts (``SpecDecodingStats``): reached is reconstructed.

        reached_1 = drafted_1; reached_j = accepted_{j-1} * drafted_j / drafted_{j-1} (exact
        when all drafts had one length; otherwise assumes length and acceptance independent).
        """
        reached = []
        for j, d in enumerate(drafted):
            if j == 0:
                reached.append(float(d))
            else:
                reached.append(accepted[j - 1] * d / drafted[j - 1] if drafted[j - 1] > 0 else 0.0)
        return cls(batch_size, k, int(num_drafts), tuple(reached), tuple(float(a) for a in accepted),
                   tuple(float(d) for d in drafted), time_s)

    def problem(self) -> str | None:
        """Why this observation must be ignored (NaN, negative, inconsistent), or None."""
        values = (self.batch_size, self.k, self.num_drafts, self.undrafted, *self.reached, *self.accepted,
                  *self.drafted)
        try:
            total = math.fsum(values) + (0.0 if self.time_s is None else self.time_s)
        except TypeError:
            return "non_numeric"
        if not math.isfinite(total):
            return "nan"
        if min(values) < 0:
            return "negative"
        if not len(self.reached) == len(self.accepted) == len(self.drafted):
            return "length_mismatch"
        for a, r, d in zip(self.accepted, self.reached, self.drafted):
            if a > r + 1e-9 or r > d + 1e-9:
                return "inconsistent"
        return None


class DecayedAcceptance:
    """Exponentially decayed reached/accepted counts per position, shrunk towards a chained prior."""

    def __init__(self, prior: Sequence[float], prior_weight: float,
                 half_life_tokens: float | None = None, half_life_s: float | None = None) -> None:
        if (half_life_tokens is None) == (half_life_s is None):
            raise ValueError("set exactly one of half_life_tokens and half_life_s")
        self.prior = [float(p) for p in prior]
        self.prior_weight = float(prior_weight)
        self.half_life_tokens = half_life_tokens
        self.half_life_s = half_life_s
        k_max = len(self.prior)
        self.reached, self.accepted = [0.0] * k_max, [0.0] * k_max
        self.fast_reached = self.fast_accepted = 0.0  # position 1 only
        self.shifts = 0
        self.last_time_s: float | None = None

    @property
    def k_max(self) -> int:
        return len(self.prior)

    def decay_factors(self, obs: StepObservation) -> list[float]:
        """0.5 ** (x_j / half_life): x_j = obs.reached_j, or the seconds since the last observation."""
        if self.half_life_tokens is not None:
            h, n = self.half_life_tokens, len(obs.reached)
            return [math.exp(-LN2 * obs.reached[j] / h) if j < n else 1.0 for j in range(self.k_max)]
        if obs.time_s is None:
            raise ValueError("half_life_s needs observations with time_s")
        dt = 0.0 if self.last_time_s is None else max(obs.time_s - self.last_time_s, 0.0)
        return [math.exp(-LN2 * dt / self.half_life_s)] * self.k_max  # type: ignore[operator]

    def update(self, obs: StepObservation) -> None:
        """Decay, add obs (positions beyond k_max are dropped), and test for a workload shift."""
        factors = self.decay_factors(obs)
        if obs.time_s is not None:
            self.last_time_s = obs.time_s
        n = min(len(obs.reached), self.k_max)
        r, a = self.reached, self.accepted
        for j, f in enumerate(factors):
            r[j] *= f
            a[j] *= f
        for j in range(n):
            r[j] += obs.reached[j]
            a[j] += obs.accepted[j]
        if n:
            ff = factors[0] ** FAST_RATIO
            self.fast_reached = self.fast_reached * ff + obs.reached[0]
            self.fast_accepted = self.fast_accepted * ff + obs.accepted[0]
            if self.shifted():
                self.reached = [self.fast_reached] + [0.0] * (self.k_max - 1)
                self.accepted = [self.fast_accepted] + [0.0] * (self.k_max - 1)
                self.shifts += 1

    def shifted(self) -> bool:
        """|fast - slow| position-1 rate > max(SHIFT_Z standard errors of the fast rate, SHIFT_MIN_DELTA)."""
        rf, r1 = self.fast_reached, self.reached[0]
        if rf < SHIFT_MIN_EVIDENCE or r1 <= rf * 1.01:
            return False
        fast, slow = self.fast_accepted / rf, self.accepted[0] / r1
        se = math.sqrt(max(slow * (1 - slow), 0.01) / rf)
        return abs(fast - slow) > max(SHIFT_Z * se, SHIFT_MIN_DELTA)

    def rates(self, floor: float = 1e-3) -> list[float]:
        """a_j = (A_j + w m_j) / (R_j + w) with the chained prior mean m_j, clamped to [floor, 1]."""
        w = self.prior_weight
        out: list[float] = []
        for j, (a, r, p) in enumerate(zip(self.accepted, self.reached, self.prior)):
            m = p if j == 0 else min(max(p * out[-1] / self.prior[j - 1], floor), 1.0)
            den = r + w
            est = (a + w * m) / den if den > 0 else m
            out.append(min(max(est, floor), 1.0))
        return out

    def evidence(self) -> list[float]:
        """Decayed number of drafts that reached each position."""
        return list(self.reached)


class DecayedDraftRate:
    """Share q of request-steps that draft, for drafters that propose only on a match (n-gram).

        q = (D + w q0) / (D + U + w)

    D, U: drafts and undrafted request-steps, both multiplied by 0.5 ** ((d + u) / half_life)
    before adding an observation's d and u (or by the time decay of ``DecayedAcceptance``);
    q0: the prior (the tuner's ``AcceptanceCounts.draft_rate``), w its weight in request-steps.
    """

    def __init__(self, prior: float, prior_weight: float, half_life: float | None = None,
                 half_life_s: float | None = None) -> None:
        if not 0 < prior <= 1:
            raise ValueError(f"draft-rate prior must lie in (0, 1], got {prior}")
        self.prior, self.prior_weight = float(prior), float(prior_weight)
        self.half_life, self.half_life_s = half_life, half_life_s
        self.drafts = self.undrafted = 0.0
        self.last_time_s: float | None = None

    def update(self, drafts: float, undrafted: float, time_s: float | None = None) -> None:
        if self.half_life is not None:
            f = math.exp(-LN2 * (drafts + undrafted) / self.half_life)
        else:
            dt = 0.0 if self.last_time_s is None or time_s is None else max(time_s - self.last_time_s, 0.0)
            f = math.exp(-LN2 * dt / self.half_life_s) if self.half_life_s else 1.0
        if time_s is not None:
            self.last_time_s = time_s
        self.drafts = self.drafts * f + drafts
        self.undrafted = self.undrafted * f + undrafted

    @property
    def rate(self) -> float:
        den = self.drafts + self.undrafted + self.prior_weight
        q = (self.drafts + self.prior_weight * self.prior) / den if den > 0 else self.prior
        return min(max(q, 1e-3), 1.0)


class CumulativeCounters:
    """Turns cumulative counters (e.g. Prometheus totals) into per-window deltas.

    A window whose counters went backwards (engine restart, counter reset) or hold
    NaN is ignored: ``delta`` returns None and the new totals become the baseline.
    """

    def __init__(self) -> None:
        self.last: tuple[float, ...] | None = None
        self.ignored = 0

    def delta(self, totals: Sequence[float]) -> tuple[float, ...] | None:
        values = tuple(float(v) for v in totals)
        bad = any(math.isnan(v) or math.isinf(v) for v in values)
        prev, self.last = self.last, (None if bad else values)
        if bad:
            self.ignored += 1
            return None
        if prev is None:
            return None
        if len(prev) != len(values) or any(v < p for v, p in zip(values, prev)):
            self.ignored += 1
            return None
        return tuple(v - p for v, p in zip(values, prev))
