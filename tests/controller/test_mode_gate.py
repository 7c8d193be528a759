"""The per-request controller's gate: an A/B test between its per-row plans and the batch controller's k."""

import random

import pytest
from margins import binomial_margin

from tabletune.controller.mode_gate import BATCH, KEPT_PAIRS, ROWS, GateConfig, ModeGate, probe_interval
from tabletune.errors import InputError


def run(gate: ModeGate, steps: int, tokens_of, step_s: float = 0.001, speed_off: float = 1.0, t0: float = 0.0):
    """Drive the gate as an engine would: each step runs in the gate's current mode; (modes, end time)."""
    modes, t = [], t0
    for i in range(steps):
        mode = gate.mode
        modes.append(mode)
        t += step_s
        gate.observe(mode, tokens_of(mode, i), t, speed_off)
    return modes, t


def runs_of(modes):
    out = []
    for m in modes:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return [tuple(x) for x in out]


def test_hand_worked_trial_choice_and_probes():
    """Rows serve 11 tokens a 1 ms step, the batch 10: the trial alternates windows of 32 steps for 4 pairs, finds
    D = 11 / 10 - 1 = 0.1 and keeps the rows; it probes the batch one window after every 0.1 / 0.005 = 20."""
    gate = ModeGate(GateConfig(window_steps=32, trial_pairs=4, probe_cost=0.005))
    modes, _ = run(gate, 8 * 32 + 2 * 21 * 32, lambda mode, i: 11 if mode == ROWS else 10)
    assert gate.gap == pytest.approx(0.1)
    assert [p.difference for p in gate.pairs] == pytest.approx([0.1] * 6)
    assert runs_of(modes) == [(ROWS, 32), (BATCH, 32)] * 4 + [(ROWS, 20 * 32), (BATCH, 32)] * 2
    assert probe_interval(gate.gap, gate.cfg) == 20


def test_the_losing_rows_are_probed_more_often_the_closer_they_are():
    """The batch 5% faster: it is kept, and the rows probed one window in 0.05 / 0.005 = 10."""
    gate = ModeGate()
    modes, _ = run(gate, 8 * 32 + 2 * 11 * 32, lambda mode, i: 19 if mode == ROWS else 20)
    assert gate.mode == BATCH and gate.gap == pytest.approx(-0.05)
    # the trial's last window is the batch's: the first stretch of the batch goes on from it
    assert runs_of(modes)[7:] == [(BATCH, 11 * 32), (ROWS, 32), (BATCH, 10 * 32), (ROWS, 32)]


def test_a_window_rate_is_tokens_over_its_span_at_the_speed_without_speculation():
    """A window's first step starts its clock; its rate is tokens / sum(span_ms * b / T(b, 0)): rows that serve
    twice the tokens at twice the batch's speed without speculation are worth the same (D = 0); a step of the
    other mode (decided before a switch) counts in neither window."""
    gate = ModeGate(GateConfig(window_steps=4, trial_pairs=1))
    t = 0.0
    for i in range(4):  # rows: steps of 2 ms, 8 tokens, b / T(b, 0) = 2 tokens/ms -> 8 / (2 * 2) = 2
        t += 0.002
        gate.observe(ROWS, 8 if i else 1000, t, 2.0)  # the first step only starts the clock
        if i == 1:  # a step of the other mode inside the window: neither its tokens nor its 7 ms count
            t += 0.007
            gate.observe(BATCH, 1000, t, 2.0)
    assert gate.mode == BATCH
    t += 0.005
    gate.observe(ROWS, 1000, t, 2.0)  # decided before the switch: not counted, and starts no window
    for i in range(4):  # batch: steps of 1 ms, 2 tokens, 1 token/ms -> 2 / (1 * 1) = 2
        t += 0.001
        gate.observe(BATCH, 2 if i else 1000, t, 1.0)
    assert gate.trial_left == 0
    assert gate.pairs[0].rows == pytest.approx(2.0) and gate.pairs[0].batch == pytest.approx(2.0)
    assert gate.gap == pytest.approx(0.0)


def test_a_gate_serving_for_long_keeps_a_bounded_record():
    """Every probe adds a pair to D; the gate keeps only the last KEPT_PAIRS to read back, and counts them all."""
    gate = ModeGate(GateConfig(window_steps=2, trial_pairs=1, min_interval=1, max_interval=1))
    run(gate, 4 * 3 * (KEPT_PAIRS + 10), lambda mode, i: 11 if mode == ROWS else 10)
    assert gate.num_pairs > KEPT_PAIRS + 10 and len(gate.pairs) == KEPT_PAIRS
    assert gate.gap == pytest.approx(0.1)


def test_a_shift_restarts_the_trial():
    gate = ModeGate()
    run(gate, 8 * 32, lambda mode, i: 9 if mode == ROWS else 10)
    assert gate.mode == BATCH and gate.trial_left == 0
    gate.shift()
    assert gate.mode == ROWS and gate.trial_left == 4 and gate.gap == 0.0 and not gate.pairs
    assert gate.num_pairs == 0


def test_a_mode_that_loses_by_5_percent_is_chosen_as_rarely_as_the_noise_says():
    """Tokens a step vary by 20% (chat at b = 8): the module docstring puts the trial's wrong choice of a mode
    that loses by 5% at P(Z > 0.05 / 0.027) = 3.4%; over 400 trials the share stays within the binomial margin."""
    trials, wrong = 400, 0
    for seed in range(trials):
        rng = random.Random(seed)
        gate = ModeGate()
        run(gate, 8 * 32, lambda mode, i: 10.0 * (0.95 if mode == ROWS else 1.0) * (1 + 0.2 * rng.gauss(0, 1)))
        assert gate.trial_left == 0
        wrong += gate.mode == ROWS
    assert wrong / trials <= 0.034 + binomial_margin(0.034, trials)


@pytest.mark.parametrize("field,value", [("window_steps", 1), ("trial_pairs", 0), ("probe_cost", 0.0),
                                         ("min_interval", 0), ("memory", 1.0), ("decisive", 0.0)])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(InputError, match=field):
        GateConfig(**{field: value})


def test_a_decisive_first_pair_ends_the_trial():
    """Rows serve twice the batch's tokens (D = 1, as on code-edit): one pair reaches ``decisive`` (0.25), so the
    trial's three other batch windows are not run; the batch is probed one window in min(1 / 0.005, 256) = 200."""
    gate = ModeGate()
    modes, _ = run(gate, 2 * 32 + 201 * 32, lambda mode, i: 20 if mode == ROWS else 10)
    assert gate.trial_left == 0 and gate.gap == pytest.approx(1.0) and gate.num_pairs == 2
    assert runs_of(modes) == [(ROWS, 32), (BATCH, 32), (ROWS, 200 * 32), (BATCH, 32)]


def test_a_difference_below_decisive_runs_the_whole_trial():
    """D = 0.2 < 0.25 after every pair: the trial runs its four pairs."""
    gate = ModeGate()
    modes, _ = run(gate, 8 * 32 + 32, lambda mode, i: 12 if mode == ROWS else 10)
    assert runs_of(modes)[:9] == [(ROWS, 32), (BATCH, 32)] * 4 + [(ROWS, 32)]


def test_a_prefill_inside_a_window_is_left_out_of_its_span():
    """Rows and batch both serve 10 tokens a 1 ms step; a rows step follows a 5 ms prefill of admissions (its span
    6 ms, prefill 5 ms): left out, D = 0 (counted, the rows' window would read 31 / 36 of the batch's)."""
    gate = ModeGate(GateConfig(window_steps=32, trial_pairs=1))
    t = 0.0
    for i in range(64):
        mode = gate.mode
        prefill = 0.005 if i == 10 else 0.0
        t += 0.001 + prefill
        gate.observe(mode, 10, t, 1.0, prefill)
    assert gate.num_pairs == 1 and gate.gap == pytest.approx(0.0)
