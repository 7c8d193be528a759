"""The one Policy interface: choose draft lengths before a step, observe the step after it.

A policy is constructed once with a :class:`PolicyContext` (the offline step-time
profile, the operator's prior acceptance rates, the allowed ks) and then, every
decode step:

1. ``decide(state: BatchState) -> Decision``: state describes the running batch
   *before* the step: stable request ids, tokens generated so far, and (only if the
   policy sets ``uses_features = True``) the drafters' confidence signals for every
   position each request could draft (:class:`DraftFeatures`).
2. the engine (simulator or vLLM) drafts, verifies, and calls
   ``observe(outcome: StepOutcome)`` with what happened: per-request draft length
   actually verified, tokens accepted, per-position KL(target || draft), step time.

Decisions come in two shapes, both ordinary :class:`Decision` objects:

* one k for the whole batch (``Decision.batch(k)``): fixed k, speculation off (k=0),
  tables, the controller, TurboSpec-style, Nightjar-style;
* a length per request (``Decision.per_request(ks, drafter)``): DISCO, TapOut, DSDE,
  GammaTune, adaptive verification, Hybrid Spark, hybrid-static. ``ks[i]`` is the draft length of
  ``state.request_ids[i]``; ``drafter[i]`` picks the model drafter (``MODEL``) or the
  n-gram drafter (``NGRAM``); None means the setting's default drafter
  (``ctx.default_drafter``).

Token-by-token stopping rules (DISCO, TapOut, GammaTune, DSDE, ``controller:per-request``)
implement ``DraftStop.keep_drafting``: a row's draft ends at the first position where the rule
says stop, and the rule sees only the signals of positions <= j when deciding whether to draft
j + 1. No peeking: such a policy's ``decide`` runs *before* anything is drafted, on the engine
as in the simulator, so it gets ``state.features = None`` (no model signal of any position)
and returns caps; the n-gram lookup, which costs no drafter step, comes with the state as
``state.ngram_match_len`` / ``state.ngram_num_proposed`` (``BatchState.before_drafting``). A policy
without a stop rule that plans on that lookup sets ``uses_lookup = True`` (``hybrid-static``): it is decided
before drafting too, its n-gram rows take no model drafting, and nothing is read back between drafted
positions.
The outcome's state carries the drafted signals (``features``) for ``observe``. A policy
without a stop rule that sets ``uses_features`` reads every position's signals in ``decide``
(the engine drafts all of them first, and the step pays for drafting them).

Conventions:

* Positions j = 1..k_max are array columns 0..k_max-1. Arrays are numpy, shape in the
  comment next to each field.
* An n-gram drafter proposes at most ``features.ngram_num_proposed[i]`` tokens (0 when
  no suffix match). A request given the n-gram drafter with ``ks[i]`` larger than
  that verifies only ``ngram_num_proposed[i]`` tokens; ``StepOutcome.ks`` reports the
  lengths actually verified.
* ``observe`` of a step follows its ``decide`` before the next ``decide``, unless the policy sets
  ``observe_may_lag = True``: then an engine may observe step t after deciding step t + 1 (the policy keys
  what it keeps from a step by ``state.step``).
* ``decides_ahead = True``: the decision of step t + 1 needs nothing of step t's outcome (a fixed k, a table, the
  batch controller, TurboSpec-style, SGLang-style: the batch size and what it learnt up to step t - 1), so an engine may make it before step t's
  read-back, on a state whose ``num_generated`` is one step old, where the batch can not change (with
  ``observe_may_lag``: step t is observed after it). Engines read it before each step: a policy that plans on
  the lookup may say True for the steps it plans without it (the per-request controller's batch mode, ``gate``);
  it is then given no lookup.
* ``StepOutcome.accepted[i]`` counts accepted draft tokens (0..ks[i]); the bonus token
  is extra, so request i emits ``accepted[i] + 1`` tokens.
* Every k a policy returns must be in ``ctx.ks`` for batch decisions; per-request
  lengths may be any integer in 0..ctx.k_max (the cost model interpolates, see
  ``tabletune.cost``).
* Policies never see the workload's true rates; they learn from ``observe``.
* ``ctx.cost.mixed_ms(ks)`` gives the modelled step time of a mixed-length step and
  ``ctx.cost.budget_ms(b, slots)`` the time T(budget) of a batch verifying ``slots``
  draft tokens in total (adaptive verification).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from tabletune.goodput import DraftYield

from tabletune.cost import StepCost

MODEL = 0  # model-based drafter (EAGLE-like, draft model, ...)
NGRAM = 1  # n-gram (prompt lookup) drafter


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows before the first step. Offline knowledge only."""

    cost: StepCost  # offline T(b, k), mixed-length and budget costing
    prior_rates: tuple[float, ...]  # conditional acceptance a_1.. measured offline (may be stale)
    ks: tuple[int, ...]  # allowed batch-wide k (measured; includes 0)
    max_num_seqs: int = 128
    default_drafter: int = MODEL
    seed: int = 0
    # n-gram calibration table fit once on general text: ngram_rates[L] = conditional
    # acceptance of an n-gram draft token when the suffix match length is L (index 0 unused)
    ngram_rates: tuple[float, ...] = ()
    # share of request-steps whose drafter proposed, measured offline with the prior rates (n-gram: < 1)
    prior_draft_rate: float = 1.0
    # a drafter that proposes only on a match: tokens per request-step and draft rate measured at each k
    prior_yields: tuple[DraftYield, ...] = ()

    @property
    def k_max(self) -> int:
        return max(self.ks)


@dataclass(frozen=True)
class DraftFeatures:
    """Drafters' confidence signals before verification (filled only for ``uses_features``).

    For the model drafter, per request i and drafted position j (column j-1):
    ``top1_prob`` the drafter's top-1 probability, ``entropy`` its entropy in nats,
    ``margin`` top-1 minus top-2 probability. Higher top1/margin and lower entropy go with
    acceptance (the simulator's model is in ``tabletune.sim.acceptance``).
    """

    top1_prob: np.ndarray  # [batch_size, k_max] float in (0, 1)
    entropy: np.ndarray  # [batch_size, k_max] float >= 0, nats
    margin: np.ndarray  # [batch_size, k_max] float in [0, 1)
    ngram_match_len: np.ndarray  # [batch_size] int, suffix-match length L (0: no match)
    ngram_num_proposed: np.ndarray  # [batch_size] int, tokens the n-gram drafter can propose


@dataclass(frozen=True)
class BatchState:
    """The running batch before a decode step."""

    step: int  # 0, 1, 2, ...
    time_s: float  # simulated (or wall) time at the start of the step
    request_ids: np.ndarray  # [batch_size] int64, stable for a request's lifetime
    num_generated: np.ndarray  # [batch_size] int, output tokens emitted so far (0: new request)
    features: DraftFeatures | None = None  # only for policies with uses_features = True
    # the n-gram lookup, known before drafting (a suffix match costs no drafter step); None where not looked up
    ngram_match_len: np.ndarray | None = None  # [batch_size] int, suffix-match length L (0: no match)
    ngram_num_proposed: np.ndarray | None = None  # [batch_size] int, tokens the n-gram drafter can propose

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    def before_drafting(self) -> BatchState:
        """The state a stop-rule policy decides on: no model signal (``features`` None), the n-gram lookup kept."""
        f = self.features
        if f is None:
            return self
        return BatchState(self.step, self.time_s, self.request_ids, self.num_generated, None,
                          f.ngram_match_len if self.ngram_match_len is None else self.ngram_match_len,
                          f.ngram_num_proposed if self.ngram_num_proposed is None else self.ngram_num_proposed)


@dataclass(frozen=True)
class Decision:
    """One k for the batch, or one per request (with an optional drafter per request)."""

    k: int | None = None
    ks: np.ndarray | None = None  # [batch_size] int
    drafter: np.ndarray | None = None  # [batch_size] int, MODEL or NGRAM; None: ctx.default_drafter

    @classmethod
    def batch(cls, k: int) -> Decision:
        return cls(k=int(k))

    @classmethod
    def per_request(cls, ks: np.ndarray, drafter: np.ndarray | None = None) -> Decision:
        return cls(ks=np.asarray(ks, dtype=np.int64), drafter=drafter)

    def ks_for(self, batch_size: int) -> np.ndarray:
        """[batch_size] draft lengths requested (before n-gram capping)."""
        if self.ks is not None:
            if len(self.ks) != batch_size:
                raise ValueError(f"per-request ks has {len(self.ks)} entries for a batch of {batch_size}")
            return self.ks
        if self.k is None:
            raise ValueError("a Decision needs k or ks")
        return np.full(batch_size, self.k, dtype=np.int64)


@dataclass(frozen=True)
class StepOutcome:
    """What one verify step did, reported to ``Policy.observe``."""

    state: BatchState  # the state the decision was made on
    ks: np.ndarray  # [batch_size] int, draft tokens actually verified per request
    drafter: np.ndarray  # [batch_size] int, MODEL or NGRAM
    accepted: np.ndarray  # [batch_size] int, accepted draft tokens (bonus excluded)
    step_ms: float  # measured step time (noise included), prefill excluded
    # KL(target || draft) at each verified position; NaN where not verified (only for uses_features)
    kl: np.ndarray | None = None  # [batch_size, k_max]
    finished_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # ids that ended
    # when the step ended, on the clock of ``state.time_s`` (None: time_s + step_ms); the spans between steps' ends
    # hold everything a step waits on (an engine's host time, prefills), and a step decided ahead has a time_s
    # from before the last step ended
    end_s: float | None = None
    prefill_ms: float = 0.0  # the admissions' prefills run before the step, inside its span (no policy's work)

    @property
    def num_tokens(self) -> int:
        """Output tokens emitted this step: sum_i (accepted_i + 1)."""
        return int(self.accepted.sum()) + len(self.accepted)

    @property
    def ended_s(self) -> float:
        """``end_s``, else time_s + step_ms."""
        return self.end_s if self.end_s is not None else self.state.time_s + self.step_ms / 1000.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens * 1000.0 / self.step_ms if self.step_ms > 0 else 0.0


@runtime_checkable
class Policy(Protocol):
    """Chooses draft lengths per step; learns from outcomes. Construct with (ctx, **options)."""

    name: ClassVar[str]
    uses_features: ClassVar[bool]  # True: the engine fills state.features and outcome.kl

    def decide(self, state: BatchState) -> Decision: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class BatchPolicy:
    """Base for one-k-per-batch policies: subclasses implement ``k_for(state)``; observe is a no-op."""

    name: ClassVar[str] = "batch"
    uses_features: ClassVar[bool] = False

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def k_for(self, state: BatchState) -> int:
        raise NotImplementedError

    def decide(self, state: BatchState) -> Decision:
        return Decision.batch(self.k_for(state))

    def observe(self, outcome: StepOutcome) -> None:
        return None


@runtime_checkable
class DraftStop(Protocol):
    """Ends a row's draft at any position, while the drafter runs (DISCO, TapOut, GammaTune, any signal rule).

    The engine (or the simulator) drafts position by position. After drafting position j
    (1-based) for the rows in ``active`` it calls ``keep_drafting(state, features, j, active)``;
    ``features`` holds the signals of positions 1..j (columns 0..j-1) and ``state`` is the
    batch before the step. The answer is a [batch_size] bool mask, True where the row drafts
    position j+1; it is read only where ``active`` is True (a row that stopped never restarts).
    The draft loop ends when no row continues or j reaches the step's cap; a row that
    stopped at j drafted j tokens and is verified on at most those j (``decide`` may verify
    fewer). Rows that stop cost no further drafting and no verification past their stop.
    The rule may use positions <= j only, which is all it is given. Such a policy's ``decide`` runs
    before drafting, on ``BatchState.before_drafting()`` (no model signal, the n-gram lookup kept), and
    its ks cap the rows; a row it puts on the n-gram chain (beside a model default drafter) takes no
    model drafting and verifies the lookup's proposal (``StepCost.mixed_ms`` with ``free`` rows).
    """

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray: ...


class AlwaysDraft:
    """The null ``DraftStop``: every active row drafts up to the step's cap."""

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray:
        return active.copy()


ALWAYS_DRAFT = AlwaysDraft()


def draft_stop_of(policy: object) -> DraftStop:
    """The policy itself when it implements ``keep_drafting`` (unless it turned its rule off: ``stops_drafts``
    False), else the null rule that never stops a draft."""
    stops = callable(getattr(policy, "keep_drafting", None)) and getattr(policy, "stops_drafts", True)
    return policy if stops else ALWAYS_DRAFT  # type: ignore[return-value]


def nearest_k(k: int, ks: tuple[int, ...]) -> int:
    """The largest allowed k' <= k (the smallest allowed one if none is)."""
    below = [x for x in ks if x <= k]
    return max(below) if below else min(ks)
