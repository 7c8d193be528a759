"""The acceptance process of the model drafter, with per-request heterogeneity and a confidence signal.

Parametric model (stated; to be calibrated from measured traces under
``profiles/traces/`` when they exist):

* Request i has a logit shift u_i ~ N(0, h^2) (h = ``Workload.heterogeneity``). Its
  conditional acceptance at position j is a_ij = sigmoid(theta_j + u_i).
* theta_j is calibrated so that the *population* survival matches the workload's rates:
  E_u[prod_{l<=j} sigmoid(theta_l + u)] = S_j = prod_{l<=j} a_l (Gauss-Hermite over u,
  bisection position by position). So E[tokens | k] over requests equals
  1 + sum_{i<=k} S_i exactly, whatever h is, and fixed-k throughput stays analytic.
* Each drafted token has a latent margin m_ij = theta_j + u_i - z_ij with z_ij standard
  logistic; the target accepts it iff m_ij > 0 (probability a_ij). A draft of length k
  keeps its leading run of accepted positions.
* The drafter's confidence is a noisy reading of that margin: g_ij = m_ij + tau * eta_ij,
  eta ~ N(0, 1), tau = ``Workload.signal_noise`` (default 2.0: top-1 AUC ~0.84, against
  0.82-0.87 measured on issue 7's early-exit traces at temperature 0;
  ``tabletune.sim.traces.signal_noise_for_auc`` fits tau to a measured AUC);
  top1_prob = sigmoid(0.7 g + 0.3); the remaining mass 1 - top1 is spread over
  V = 1 + exp(w) tokens, w ~ N(2, 0.7), giving
  entropy = -q ln q - (1 - q) ln((1 - q) / V); top2 = (1 - q) r, r ~ U(0.2, 0.9),
  margin = q - min(q, top2).
* KL(target || draft) at a verified position: 0.5 * softplus(-0.8 m + 0.5 eta'), large
  where the token is rejected (DSDE's signal).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_GH_X, _GH_W = np.polynomial.hermite.hermgauss(40)
_GH_W = _GH_W / np.sqrt(np.pi)


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


def calibrate_logits(rates: Sequence[float], heterogeneity: float) -> np.ndarray:
    """theta_1..theta_K with E_u[prod_{l<=j} sigmoid(theta_l + u)] = prod_{l<=j} a_l, u ~ N(0, h^2)."""
    u = np.sqrt(2.0) * heterogeneity * _GH_X  # quadrature nodes for u
    prefix = np.ones_like(u)  # prod_{l<j} sigmoid(theta_l + u) at each node
    target = 1.0
    thetas = []
    for a in rates:
        target *= a
        if a >= 1.0:
            thetas.append(30.0)
            continue
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if float(_GH_W @ (prefix * sigmoid(mid + u))) < target:
                lo = mid
            else:
                hi = mid
        theta = 0.5 * (lo + hi)
        thetas.append(theta)
        prefix = prefix * sigmoid(theta + u)
    return np.array(thetas)


def draw_margins(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """m_ij = logit_ij - z_ij, z standard logistic. logits is [batch_size, k_max]."""
    u = rng.random(logits.shape) * (1 - 2e-12) + 1e-12  # in (0, 1)
    return logits - np.log(u / (1.0 - u))


def accepted_count(margin: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Leading run of accepted positions (margin > 0), capped at each row's k. Returns [batch_size]."""
    run = (margin > 0).cumprod(axis=1).sum(axis=1)  # [batch_size]
    return np.minimum(run, ks)


def confidence_features(margin: np.ndarray, noise: np.ndarray | float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(top1_prob, entropy, margin_top12, signal), each [batch_size, k_max], by the model above."""
    signal = margin + noise * rng.standard_normal(margin.shape)
    q = sigmoid(0.7 * signal + 0.3)
    np.clip(q, 1e-6, 1 - 1e-6, out=q)
    vocab = 1.0 + np.exp(rng.normal(2.0, 0.7, margin.shape))
    entropy = -q * np.log(q) - (1.0 - q) * np.log((1.0 - q) / vocab)
    top2 = np.minimum(q, (1.0 - q) * rng.uniform(0.2, 0.9, margin.shape))
    return q, entropy, q - top2, signal


def kl_divergence(margin: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """KL(target || draft) per position: 0.5 * softplus(-0.8 m + 0.5 eta). [batch_size, k_max]."""
    x = -0.8 * margin + 0.5 * rng.standard_normal(margin.shape)
    return 0.5 * np.logaddexp(0.0, x)


def request_logits(thetas: np.ndarray, heterogeneity: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Logits theta_j + u_i for n new requests: [n, k_max]."""
    u = rng.normal(0.0, heterogeneity, size=(n, 1)) if heterogeneity > 0 else np.zeros((n, 1))
    return thetas[None, :] + u


def population_survival(thetas: np.ndarray, heterogeneity: float) -> np.ndarray:
    """E_u[prod_{l<=j} sigmoid(theta_l + u)] for each j (the calibration target)."""
    u = np.sqrt(2.0) * heterogeneity * _GH_X
    probs = sigmoid(thetas[None, :] + u[:, None])  # [nodes, k_max]
    return _GH_W @ np.cumprod(probs, axis=1)
