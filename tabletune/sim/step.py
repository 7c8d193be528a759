"""One simulated step's random draws, in one object, so that ``loop`` reads a step top-down.

``StepDraws`` owns what the acceptance model (``acceptance``) and the n-gram span model (``ngram``), or the
replayed traces (``replay``), draw for the running requests in one step. The draws come from the run's one stream
in a fixed order, which is part of the results (policies compared on a seed see the same draws):

1. at construction, before the decision: the n-gram lookup (match length, proposals: ``ngram.propose``, or the
   n-gram trace's window); for a policy that reads draft signals, every position's model margin and its
   confidence signals (or the trace's window), so that the policy sees them in ``state``;
2. ``accepted``, after the draft lengths are known: the model margins of the positions verified (when not drawn
   in 1), the n-gram chain's margins on its rows; ``kl`` for a feature policy;
3. ``advance_spans``, after the step's tokens are known: the copyable spans move on.

A margin > 0 is an accepted position; a draft keeps its leading run of accepted positions.
"""

from __future__ import annotations

import numpy as np

from tabletune.policies.base import BatchState, DraftFeatures
from tabletune.sim import acceptance as acc
from tabletune.sim import ngram
from tabletune.sim.requests import RunningRequests


class StepDraws:
    def __init__(self, sim, reqs: RunningRequests, rng: np.random.Generator, track_ngram: bool,
                 uses_features: bool, zeros: np.ndarray) -> None:
        self.sim, self.reqs, self.rng, self.k_max = sim, reqs, rng, sim.k_max
        self.track_ngram, self.uses_features, self.zeros = track_ngram, uses_features, zeros
        # [batch_size, k_max] the n-gram chain's recorded outcomes (an n-gram trace), else None
        self.ng_ok: np.ndarray | None = None
        if track_ngram and sim.ngram_replay is not None:
            self.ng_ok, self.ng_prop, self.ng_len = sim.ngram_replay.window(reqs.trace_pos, self.k_max)
        elif track_ngram:
            self.ng_prop, self.ng_len = ngram.propose(reqs.span_left, reqs.match_len,
                                                      sim._w["spurious_match_prob"][reqs.widx], self.k_max, rng)
        else:
            self.ng_prop = self.ng_len = zeros  # [batch_size] proposals, match length
        # [batch_size, k_max] the model drafter's margins: now from a trace (+-1: accept / reject) or for a policy
        # that reads signals, else in ``accepted``
        self.margin: np.ndarray | None = None
        self.features: DraftFeatures | None = None
        if sim.replay is not None:
            ok, *signals = sim.replay.window(reqs.trace_pos, self.k_max)
            self.margin = np.where(ok, 1.0, -1.0)
            if uses_features:
                self.features = DraftFeatures(*signals, self.ng_len, self.ng_prop)
        elif uses_features:
            self.margin = acc.draw_margins(reqs.logits, rng)
            noise = sim._w["signal_noise"][reqs.widx][:, None]
            top1, entropy, margin12, _ = acc.confidence_features(self.margin, noise, rng)
            self.features = DraftFeatures(top1, entropy, margin12, self.ng_len, self.ng_prop)

    def state(self, step: int, time_s: float) -> BatchState:
        """What the policy sees: the running requests, the signals (a feature policy), the n-gram lookup."""
        lookup = (self.ng_len, self.ng_prop) if self.track_ngram else (None, None)
        return BatchState(step, time_s, self.reqs.ids, self.reqs.generated, self.features, *lookup)

    def fates(self) -> tuple[np.ndarray, np.ndarray | None]:
        """([batch_size] the model draft's accepted run, the n-gram chain's when it is replayed): what the
        headroom oracle (``tabletune.sim.oracle``) is told before it decides; needs the margins drawn."""
        fate = (self.margin > 0).cumprod(axis=1).sum(axis=1)
        if self.ng_ok is None:
            return fate, None
        return fate, np.minimum(self.ng_ok.cumprod(axis=1).sum(axis=1), self.ng_prop)

    def accepted(self, ks: np.ndarray, is_ngram: np.ndarray) -> np.ndarray:
        """[batch_size] accepted drafts: the leading run of accepted positions, capped at k_i; rows ``is_ngram``
        verify the n-gram chain's proposal."""
        width = int(ks.max()) if len(ks) else 0
        if width == 0:
            return self.zeros
        if self.margin is None:
            self.margin = acc.draw_margins(self.reqs.logits[:, :width], self.rng)
        m = self.margin[:, :width]
        if is_ngram.any():
            ng_m = (np.where(self.ng_ok[:, :width], 1.0, -1.0) if self.ng_ok is not None
                    else ngram.margins(self.reqs.span_left, self.ng_len, width, self.rng))
            m = np.where(is_ngram[:, None], ng_m, m)
        return acc.accepted_count(m, ks)

    def kl(self, ks: np.ndarray) -> np.ndarray | None:
        """[batch_size, k_max] KL(target || draft) of the verified positions (NaN past k_i) for a feature policy
        on the model (not replayed: traces record none), else None."""
        if not self.uses_features or self.sim.replay is not None:
            return None
        kl = acc.kl_divergence(self.margin, self.rng)
        kl[np.arange(self.k_max)[None, :] >= ks[:, None]] = np.nan
        return kl

    def advance_spans(self, tokens: np.ndarray) -> None:
        """The requests' copyable spans after each emitted ``tokens`` (when an n-gram drafter can be chosen)."""
        if self.track_ngram:
            reqs, w = self.reqs, self.sim._w
            reqs.span_left, reqs.match_len = ngram.advance(
                reqs.span_left, reqs.match_len, tokens, w["span_start_prob"][reqs.widx],
                w["span_mean_len"][reqs.widx], self.rng)
