"""Margins for assertions on measured shares, so that a threshold follows from what the test controls.

``binomial_margin(p, n)``: X ~ Binomial(n, p) gives |X / n - p| > margin with probability at most
ALPHA = 1e-6 (exact tails, not the normal approximation, which is too short on the skewed side), so an
assertion within it fails a correct implementation about once in a million runs: a failure means a bug.
``mean_margin(sd, n)`` does the same for a mean of many draws.

The controller's estimators (``tabletune.controller.estimator``) decay their counts: after a window of
x draws the older counts are multiplied by f ** x, f = 0.5 ** (1 / h), h the half-life in draws. Their
estimate (A + w m) / (S + w) (A the decayed successes, S the decayed draws, w the prior's weight, m its
mean) errs by a sampling term (the decayed share is worth N_eff = S ** 2 / sum(weight ** 2) independent
draws; ``decayed_count``) plus the prior's pull w |m - p| / (S + w): ``estimate_margin``.
"""

from __future__ import annotations

import math

ALPHA = 1e-6
Z = 4.9  # standard errors of a normal mean exceeded with probability 2 (1 - Phi(4.9)) = ALPHA


def mean_margin(sd: float, n: float) -> float:
    """Z standard errors of a mean of n independent draws of standard deviation sd (n in the thousands: the
    mean is normal to well beyond Z)."""
    return Z * sd / math.sqrt(n)


def binomial_margin(p: float, n: float, alpha: float = ALPHA) -> float:
    """Smallest m with P(|X / n - p| > m) <= alpha for X ~ Binomial(n, p), n rounded down."""
    n = int(n)
    if n < 1 or not 0 < p < 1:
        raise ValueError(f"need n >= 1 draws and 0 < p < 1, got n={n}, p={p}")
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)

    def pmf(k: int) -> float:
        return math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)

    reach = 40 * math.sqrt(n * p * (1 - p)) + 1  # the mass beyond 40 standard deviations is negligible

    def first_inside(k: int, step: int) -> int:
        tail = 0.0
        while tail + pmf(k) <= alpha / 2:
            tail += pmf(k)
            k += step
        return k

    low = first_inside(max(0, math.floor(n * p - reach)), 1)
    high = first_inside(min(n, math.ceil(n * p + reach)), -1)
    return max(p - low / n, high / n - p)


def decayed_count(n: float, half_life: float) -> tuple[float, float]:
    """(S, N_eff) of the last n draws, the i-th newest weighing 0.5 ** (i / half_life)."""
    f = 0.5 ** (1 / half_life)
    s = (1 - f**n) / (1 - f)
    return s, s * s * (1 - f * f) / (1 - f ** (2 * n))


def estimate_margin(p: float, s: float, half_life: float, prior_weight: float, prior_mean: float) -> float:
    """Bound on |estimate - p| for a decayed estimate holding the decayed count s of draws of p."""
    f = 0.5 ** (1 / half_life)
    f_n = max(1 - s * (1 - f), 0.0)  # f ** n for the n draws whose decayed count is s (0: the limit, n -> inf)
    n_eff = s * s * (1 - f * f) / (1 - f_n * f_n)
    return binomial_margin(p, n_eff) + prior_weight * abs(prior_mean - p) / (s + prior_weight)


def acceptance_margins(true_rates, estimate, decayed, prior, half_life: float, prior_weight: float) -> list[float]:
    """``estimate_margin`` at each position of an ``estimator.DecayedAcceptance`` estimate, from the decayed
    counts of the drafts that reached each position; its prior mean is chained: m_1 = prior_1 and
    m_j = prior_j a_{j-1} / prior_{j-1}, a the estimate."""
    means = [prior[0]] + [prior[j] * estimate[j - 1] / prior[j - 1] for j in range(1, len(estimate))]
    return [estimate_margin(p, s, half_life, prior_weight, m) for p, s, m in zip(true_rates, decayed, means)]


def decayed_share_range(hits: int, misses: int, half_life: float, window: int, prior_weight: float,
                        prior_mean: float) -> tuple[float, float]:
    """Where a decayed share (D + w q0) / (D + U + w) (``estimator.DecayedDraftRate``) can lie after these
    hits and misses, whatever their order: lowest with the misses newest, highest with them oldest.

    A window's draws join together: the i-th newest draw weighs between f ** i (one draw per window) and
    f ** (i - window + 1) (the newest of a full window).
    """
    f = 0.5 ** (1 / half_life)

    def weight(newest: int, oldest: int) -> float:  # draws newest..oldest-1 (0: the newest)
        return (f**newest - f**oldest) / (1 - f)

    n, w, widen = hits + misses, prior_weight, f ** (1 - window)
    d_lo, u_hi = weight(misses, n), weight(0, misses) * widen
    d_hi, u_lo = weight(0, hits) * widen, weight(hits, n)
    return (d_lo + w * prior_mean) / (d_lo + u_hi + w), (d_hi + w * prior_mean) / (d_hi + u_lo + w)
