"""Step cost: T(b, k) from a measured profile, and how a step with mixed or stopped drafts is costed.

A uniform step (every request drafts k) costs the profile's T(b, k), linear in b between
measured batch sizes (``StepProfile.step_ms``). A step splits into drafting and verification:

    D(b, k)  drafting time of a k-token chain for b rows: the measured ``draft_grid`` (e.g. from
             ``StepCost.split``, D = T_model_drafter - T_cpu_drafter), else f (T(b, k) - T(b, 0))
             with f = ``draft_share``
    V(b, k)  = T(b, k) - D(b, k), the target's verification of b (k + 1) tokens

(D~, V~, T~: linear in k between measured k and in b between measured batch sizes).

The rule (one for every step). Row i drafts d_i tokens and the target verifies k_i <= d_i of
them (a row whose draft stopped at position d_i, or a policy that verifies fewer than it
drafted). With a_j = #{i : d_i >= j} the rows still drafting at position j,

    T(b; k, d) = V~(b, k_bar) + sum_{j=1}^{max d} [D~(a_j, j) - D~(a_j, j - 1)]   (a term is 0 when a_j = 0)

    k_bar = sum_i k_i / b     verification is charged by the scheduled tokens sum_i (k_i + 1)
    D~(a, j) - D~(a, j-1)     drafting position j for the a rows still drafting it

so a row that stopped costs no further drafting and no verification past its stop. With
all k_i = d_i = k this is exactly T(b, k) (the sum telescopes to D(b, k)). f = 0 (or D = 0, an
n-gram drafter on the CPU) costs a step by its verified tokens only.

``draft_rows = "batch"`` is the drafter that runs every row until the longest draft ends
(a_j = b for j <= max d, the padded drafter of engines that do not compact the draft batch):
then T = V~(b, k_bar) + D~(b, max d), which with D = f (T - T0) is the classic
T0 + f (T(b, k_max) - T0) + (1 - f) (T~(b, k_bar) - T0) (f = 1: every row pays the longest draft).
``mixed_curve_ms`` is that padded rule for many (k_top, k_bar) pairs (``fit_draft_share`` fits f to it).

Worked example (tests/test_cost.py): T(b, k) = 10 + b + 4k and D(b, k) = b k at b in {1, 4}; b = 2
rows drafting d = (3, 1) and verifying k = (3, 1): k_bar = 2, V~(2, 2) = 20 - 4 = 16; a = (2, 1, 1), so
drafting = [D(2, 1) - D(2, 0)] + [D(1, 2) - D(1, 1)] + [D(1, 3) - D(1, 2)] = 2 + 1 + 1 = 4 and T = 20
(the padded drafter: 16 + D(2, 3) = 22; both rows drafting 3: T(2, 3) = 24).

A split step. Where rows on a free drafter (the n-gram lookup) verify more tokens than any model row drafted, an
engine that drafts in one fused graph would draft those positions for nothing, so it splits the step (the model
rows' positions, the lookup, the verification, each its own launch). ``split_extra`` is what that costs beyond the
rule, measured per batch size (the engine grid's plan check), linear in b between them and flat beyond: ``mixed_ms``
adds ``split_ms(b)`` to such a step.

A read. A step that reads something back between drafting and verifying (a policy's drafted signals, a stop rule's
lengths) leaves the device idle from the read until its next launch starts running; the host's own time there is
the policy's, charged apart, but the launch's start after an idle device is the engine's. ``read_extra`` is what
one such read costs a split step, ``position_read_extra`` what each further read costs a step whose stop rule reads
after every drafted position on the host (both per batch size from the plan check, as ``split_extra``):
``read_ms(b)`` and ``position_read_ms(b)``.

``budget_ms(b, slots)`` is T for a batch-wide budget of verified draft slots,
T(b, slots / b) with f = 0; adaptive verification (DSpark-style) prices budgets with it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tabletune.profile import StepProfile


DRAFT_ROWS = ("active", "batch")


def _per_batch(pairs: tuple[tuple[int, float], ...], batch_size: float) -> float:
    """(b, ms) pairs at this batch size: linear between them, flat beyond; 0 without any."""
    if not pairs:
        return 0.0
    return float(np.interp(batch_size, [b for b, _ in pairs], [ms for _, ms in pairs]))


@dataclass(frozen=True)
class StepCost:
    """Offline step times T(b, k) plus the rule above for mixed and stopped drafts. Immutable, cheap to query."""

    profile: StepProfile
    draft_share: float = 0.5  # f: D(b, k) = f (T(b, k) - T(b, 0)) when no draft_grid is given
    # D(b, k), the drafting time of a k-token chain: [k index][b index] over profile.ks x batch_sizes
    draft_grid: tuple[tuple[float, ...], ...] | None = None
    draft_rows: str = "active"  # "active": drafting charged by the rows still drafting; "batch": by all b rows
    split_extra: tuple[tuple[int, float], ...] = ()  # (b, ms) a split step costs beyond the rule, b increasing
    read_extra: tuple[tuple[int, float], ...] = ()  # (b, ms) a read between drafting and verifying costs a step
    position_read_extra: tuple[tuple[int, float], ...] = ()  # (b, ms) each further read of a per-position rule

    def __post_init__(self) -> None:
        for name in ("split_extra", "read_extra", "position_read_extra"):
            pairs = getattr(self, name)
            bs_pairs = [b for b, _ in pairs]
            if bs_pairs != sorted(set(bs_pairs)) or any(not np.isfinite(ms) or ms < 0 for _, ms in pairs):
                raise ValueError(f"{name} must be (b, ms >= 0) pairs with b increasing, got {pairs}")
        if not 0.0 <= self.draft_share <= 1.0:
            raise ValueError(f"draft_share must lie in [0, 1], got {self.draft_share}")
        if self.draft_rows not in DRAFT_ROWS:
            raise ValueError(f"draft_rows must be one of {DRAFT_ROWS}, got {self.draft_rows!r}")
        ks = self.profile.ks
        bs = self.profile.batch_sizes
        # grid[ki, bi] = T(bs[bi], ks[ki]); a k missing at some b is interpolated in b
        grid = np.array([[self.profile.step_ms(b, k) for b in bs] for k in ks], dtype=float)
        if self.draft_grid is not None:
            dgrid = np.array(self.draft_grid, dtype=float)
            if dgrid.shape != grid.shape or not np.all(np.isfinite(dgrid)) or np.any(dgrid < 0):
                raise ValueError(f"draft_grid must be {grid.shape} finite times >= 0 (ks x batch sizes)")
        else:
            dgrid = self.draft_share * np.maximum(grid - grid[:1], 0.0)
        kf = np.array(ks, dtype=float)
        positions = np.arange(int(kf[-1]) + 1, dtype=float)
        # step[j, bi] = D~(bs[bi], j) - D~(bs[bi], j - 1): drafting position j (1-based row j - 1)
        d_int = np.array([np.interp(positions, kf, dgrid[:, bi]) for bi in range(len(bs))]).T
        object.__setattr__(self, "_position_ms", np.diff(d_int, axis=0))  # [k_max, num_batch_sizes]
        object.__setattr__(self, "_dgrid", dgrid)
        object.__setattr__(self, "_ks", kf)
        object.__setattr__(self, "_bs", np.array(bs, dtype=float))
        object.__setattr__(self, "_grid", grid)
        object.__setattr__(self, "_cache", {})

    @classmethod
    def split(cls, profile: StepProfile, draft_ms: Callable[[int, int], float], draft_rows: str = "active") -> StepCost:
        """The rule with D(b, k) = draft_ms(b, k) at the profile's measured (b, k), clipped at >= 0."""
        grid = tuple(tuple(max(float(draft_ms(b, k)), 0.0) for b in profile.batch_sizes) for k in profile.ks)
        return cls(profile, draft_grid=grid, draft_rows=draft_rows)

    @property
    def ks(self) -> list[int]:
        """The measured draft lengths."""
        return self.profile.ks

    @property
    def k_max(self) -> int:
        return int(self._ks[-1])  # type: ignore[attr-defined]

    def row(self, batch_size: float) -> np.ndarray:
        """T(b, k) for every measured k (same order as ``ks``), linear in b; cached per b."""
        return self._rows(batch_size)[0]

    def draft_row(self, batch_size: float) -> np.ndarray:
        """D(b, k) for every measured k (the draft grid, or f (T - T0)), linear in b."""
        return self._rows(batch_size)[1]

    def _rows(self, batch_size: float) -> tuple[np.ndarray, np.ndarray]:
        cache = self._cache  # type: ignore[attr-defined]
        out = cache.get(batch_size)
        if out is None:
            bs, grid, dgrid = self._bs, self._grid, self._dgrid  # type: ignore[attr-defined]
            out = (np.array([np.interp(batch_size, bs, g) for g in grid]),
                   np.array([np.interp(batch_size, bs, g) for g in dgrid]))
            if len(cache) < 4096:
                cache[batch_size] = out
        return out

    def step_ms(self, batch_size: float, k: float) -> float:
        """T(b, k); a non-integer k is linear between the neighbouring measured k."""
        row = self.row(batch_size)
        ks = self._ks  # type: ignore[attr-defined]
        if k <= ks[0]:
            return float(row[0])
        if k >= ks[-1]:
            return float(row[-1])
        i = bisect.bisect_left(ks.tolist(), k)
        if ks[i] == k:
            return float(row[i])
        w = (k - ks[i - 1]) / (ks[i] - ks[i - 1])
        return float(row[i - 1] + w * (row[i] - row[i - 1]))

    def verify_ms(self, batch_size: int, k_bar: np.ndarray | float) -> np.ndarray:
        """V~(b, k_bar) = T~(b, k_bar) - D~(b, k_bar): verifying b (k_bar + 1) scheduled tokens."""
        ks = self._ks  # type: ignore[attr-defined]
        row, drow = self._rows(batch_size)
        k_bar = np.asarray(k_bar, dtype=float)
        return np.interp(k_bar, ks, row) - np.interp(k_bar, ks, drow)

    def drafting_ms(self, active: np.ndarray) -> np.ndarray:
        """sum_j [D~(a_j, j) - D~(a_j, j - 1)] over positions j (last axis of ``active``, a_j rows drafting j).

        ``active`` is [..., J] with J <= k_max counts (non-increasing along j); a position nobody drafts
        costs nothing. Returns [...] ms.
        """
        active = np.asarray(active, dtype=float)
        pos_ms, bs = self._position_ms, self._bs  # type: ignore[attr-defined]
        if active.shape[-1] > len(pos_ms):
            raise ValueError(f"{active.shape[-1]} draft positions, the profile measures {len(pos_ms)}")
        out = np.zeros(active.shape[:-1])
        for j in range(active.shape[-1]):
            a = active[..., j]
            out = out + np.where(a > 0, np.interp(a, bs, pos_ms[j]), 0.0)
        return out

    def rows_ms(self, batch_size: int, active: np.ndarray, k_bar: np.ndarray | float) -> np.ndarray:
        """T(b; k, d) from a_j = ``active[..., j - 1]`` rows drafting position j and the mean verified length.

        With ``draft_rows = "batch"`` every position some row drafts is charged for all b rows.
        """
        active = np.asarray(active, dtype=float)
        if self.draft_rows == "batch":
            active = np.where(active > 0, float(batch_size), 0.0)
        return self.verify_ms(batch_size, k_bar) + self.drafting_ms(active)

    def rows_ms_tables(self, batch_size: int, k_max: int) -> tuple[np.ndarray, np.ndarray]:
        """``rows_ms`` of b rows as two lookups, for a plan priced on the critical path: (verify [b k_max + 1],
        drafting [k_max, b + 1]) with rows_ms(b, a, K / b) = verify[K] + sum_j drafting[j - 1, a_j] for integer
        verified tokens K and rows a_j drafting position j."""
        verify = self.verify_ms(batch_size, np.arange(batch_size * k_max + 1) / batch_size)
        counts = np.arange(batch_size + 1, dtype=float)
        if self.draft_rows == "batch":
            counts = np.where(counts > 0, float(batch_size), 0.0)
        drafting = np.zeros((k_max, batch_size + 1))
        for j in range(k_max):
            one = np.zeros((batch_size + 1, k_max))
            one[:, j] = counts
            drafting[j] = self.drafting_ms(one)
        return verify, drafting

    def split_ms(self, batch_size: float) -> float:
        """What a split step costs beyond the rule at this batch size (``split_extra``; 0 without it)."""
        return _per_batch(self.split_extra, batch_size)

    def read_ms(self, batch_size: float) -> float:
        """What a read between drafting and verifying costs a split step at this batch size (``read_extra``)."""
        return _per_batch(self.read_extra, batch_size)

    def position_read_ms(self, batch_size: float) -> float:
        """What each read after a drafted position costs beyond the first (``position_read_extra``)."""
        return _per_batch(self.position_read_extra, batch_size)

    def mixed_ms(self, ks: np.ndarray, drafted: np.ndarray | None = None, free: np.ndarray | None = None,
                 split_extra: bool = True) -> float:
        """T(b; k, d) by the rule in the module docstring: ``ks`` [b] verified, ``drafted`` [b] (default ks).

        ``free`` [b] bool marks rows whose verified tokens came from a drafter that costs no drafting time
        (the n-gram lookup on the CPU): their ``drafted`` counts only the model drafter's positions (0 when
        it did not run for them), so they may verify more than that; where they verify more than any other row
        drafted the step splits and pays ``split_ms(b)`` (``split_extra=False``: the rule alone). Raises ValueError
        when any other row verifies more than it drafted.
        """
        b = len(ks)
        if b == 0:
            return 0.0
        ks = np.asarray(ks)
        if drafted is None:
            drafted = ks
        elif np.any((ks > drafted) if free is None else (ks > drafted) & ~free):
            raise ValueError("a row verifies more tokens than it drafted (need ks <= drafted)")
        d_top = int(drafted.max())
        if d_top == int(ks.min()) and int(drafted.min()) == d_top:  # uniform: every row drafted and verified k
            return self.step_ms(b, d_top)
        active = (np.asarray(drafted)[:, None] >= np.arange(1, d_top + 1)[None, :]).sum(axis=0)
        split = split_extra and free is not None and self.split_extra and splits(ks, drafted, free)
        return float(self.rows_ms(b, active, float(ks.sum()) / b)) + (self.split_ms(b) if split else 0.0)

    def mixed_curve_ms(self, batch_size: int, k_top: np.ndarray, k_bar: np.ndarray) -> np.ndarray:
        """The padded drafter's T = V~(b, k_bar) + D~(b, k_top) for many (k_top, k_bar) pairs at one b.

        Every row drafts until the longest draft ends (``draft_rows = "batch"``); with D = f (T - T0)
        this is T0 + f (T(b, k_top) - T0) + (1 - f) (T~(b, k_bar) - T0).
        """
        ks = self._ks  # type: ignore[attr-defined]
        drow = self._rows(batch_size)[1]
        return self.verify_ms(batch_size, k_bar) + np.interp(np.asarray(k_top, dtype=float), ks, drow)

    def budget_ms(self, batch_size: int, slots: float) -> float:
        """T(budget): a step verifying ``slots`` draft tokens in total over the batch, T(b, slots/b)."""
        return self.step_ms(batch_size, slots / batch_size if batch_size else 0.0)


def splits(ks: np.ndarray, drafted: np.ndarray, free: np.ndarray) -> bool:
    """Whether a step splits: some free row verifies more than any other row drafted."""
    free = np.asarray(free, bool)
    return bool(free.any()) and int(np.asarray(ks)[free].max()) > int(np.asarray(drafted)[~free].max(initial=0))


def active_rows(drafted: np.ndarray, k_max: int) -> np.ndarray:
    """a_j = #{i : d_i >= j} for j = 1..k_max over the last axis of ``drafted`` [..., b]. Returns [..., k_max]."""
    d = np.asarray(drafted)
    return (d[..., None] >= np.arange(1, k_max + 1)).sum(axis=-2)


def partial_draft_ms(profile: StepProfile, batch_size: int, k: int, draft_rate: float, draft_share: float) -> float:
    """T_q(b, k): the expected step time when each of b requests drafts k tokens with probability q, else none.

    A drafter that proposes only on a match (n-gram) leaves a share 1 - q of the rows undrafted. With
    P = 1 - (1 - q)^b the chance that some row drafts, and k_bar = q k / P the mean draft length given
    that one does, the mixed-length rule of this module with draft share f gives

        T_q(b, k) = (1 - P) T(b, 0) + P [T(b, 0) + f (T(b, k) - T(b, 0)) + (1 - f) (T~(b, k_bar) - T(b, 0))]

    f is measured, not assumed: ``fit_draft_share`` fits it to timed steps whose rows drafted different
    lengths (an engine that pads every row to the longest draft has f = 1; one that verifies only the
    drafted tokens has f = 0). q = 1 or k = 0 gives T(b, k).
    """
    if not 0.0 < draft_rate <= 1.0:
        raise ValueError(f"draft_rate must lie in (0, 1], got {draft_rate}")
    if not 0.0 <= draft_share <= 1.0:
        raise ValueError(f"draft_share must lie in [0, 1], got {draft_share}")
    t_k = profile.step_ms(batch_size, k)
    if k == 0 or draft_rate == 1.0:
        return t_k
    t_0 = profile.step_ms(batch_size, 0)
    p_any = 1.0 - (1.0 - draft_rate) ** batch_size
    k_bar = draft_rate * k / p_any
    ks = profile.ks
    t_bar = float(np.interp(k_bar, ks, [profile.step_ms(batch_size, x) for x in ks]))
    drafted = t_0 + draft_share * (t_k - t_0) + (1.0 - draft_share) * (t_bar - t_0)
    return (1.0 - p_any) * t_0 + p_any * drafted


@dataclass(frozen=True)
class MixedStep:
    """One timed step whose rows drafted different lengths: k_top = max k_i, k_bar = mean k_i."""

    batch_size: int
    k_top: int
    k_bar: float
    measured_ms: float


def fit_draft_share(profile: StepProfile, steps: list[MixedStep]) -> float:
    """Least-squares f in  measured - T~(b, k_bar) = f (T(b, k_top) - T~(b, k_bar)),  clipped to [0, 1].

    T comes from ``profile`` (uniform steps of the same engine); a step with k_bar = k_top carries no
    information about f and is skipped. Raises ValueError when no step has k_bar < k_top.
    """
    cost = StepCost(profile)
    xs, ys = [], []
    for s in steps:
        t_top, t_bar = cost.step_ms(s.batch_size, s.k_top), cost.step_ms(s.batch_size, s.k_bar)
        if t_top - t_bar > 0:
            xs.append(t_top - t_bar)
            ys.append(s.measured_ms - t_bar)
    if not xs:
        raise ValueError("no mixed step with k_bar < k_top (and T(k_top) > T(k_bar)) to fit the draft share on")
    x, y = np.array(xs), np.array(ys)
    return float(np.clip((x * y).sum() / (x * x).sum(), 0.0, 1.0))


def fit_active_share(profile: StepProfile, steps: list[tuple[np.ndarray, float]]) -> float:
    """Least-squares f of the rule above with D = f (T - T0) and drafting by active rows, clipped to [0, 1].

    Each step is (ks [b], measured ms), every row drafting and verifying its k_i. With T~ = T~(b, k_bar)
    and A = sum_j [T~(a_j, j) - T~(a_j, j - 1)] (the drafting term at f = 1), the rule reads
    measured - T~ = f (A - (T~ - T(b, 0))). Raises ValueError when no step is mixed.
    """
    unit = StepCost(profile, draft_share=1.0)
    plain = StepCost(profile, draft_share=0.0)
    xs, ys = [], []
    for ks, measured_ms in steps:
        ks = np.asarray(ks)
        if len(ks) == 0 or ks.min() == ks.max():
            continue
        t_bar = plain.mixed_ms(ks)  # f = 0: T~(b, k_bar)
        xs.append(unit.mixed_ms(ks) - t_bar)
        ys.append(measured_ms - t_bar)
    x, y = np.array(xs), np.array(ys)
    if not len(x) or not np.any(x != 0):
        raise ValueError("no mixed step (rows of different k) to fit the draft share on")
    return float(np.clip((x * y).sum() / (x * x).sum(), 0.0, 1.0))


def fit_share_and_level(profile: StepProfile, steps: list[MixedStep], iterations: int = 50) -> tuple[float, float]:
    """(f, level) for steps timed apart from the profile: measured = level (T~(b, k_bar) + f (T(b, k_top) -
    T~(b, k_bar))), fitted robustly on relative times.

    Steps recorded while serving real text (the tuner's acceptance runs) differ from the profile's
    uniform steps in context, content and the machine's load at the time, so their level is a
    parameter of its own: dividing by T~(b, k_bar), r = level + level f x with x = (T(b, k_top) -
    T~(b, k_bar)) / T~(b, k_bar) is a line whose intercept is the level and whose slope over
    intercept is f. Steps with x = 0 (no row drafted, or all alike) pin the level. Huber-weighted
    least squares (re-weighted ``iterations`` times, MAD scale) keeps a step slowed by another
    process from moving the fit; f is clipped to [0, 1]. Raises ValueError without a step with x > 0.
    """
    cost = StepCost(profile)
    xs, rs = [], []
    for s in steps:
        t_top, t_bar = cost.step_ms(s.batch_size, s.k_top), cost.step_ms(s.batch_size, s.k_bar)
        if t_bar > 0:
            xs.append(max(t_top - t_bar, 0.0) / t_bar)
            rs.append(s.measured_ms / t_bar)
    x, r = np.array(xs), np.array(rs)
    if not np.any(x > 0):
        raise ValueError("no mixed step with k_bar < k_top (and T(k_top) > T(k_bar)) to fit the draft share on")
    design = np.stack([np.ones_like(x), x], axis=1)
    weights = np.ones_like(r)
    for _ in range(iterations):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(design * root[:, None], r * root, rcond=None)[0]
        resid = r - design @ coef
        scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        if scale <= 0:
            break
        limit = 1.345 * scale
        weights = np.where(np.abs(resid) <= limit, 1.0, limit / np.maximum(np.abs(resid), 1e-12))
    level, slope = float(coef[0]), float(coef[1])
    return float(np.clip(slope / level, 0.0, 1.0)) if level > 0 else 1.0, level
