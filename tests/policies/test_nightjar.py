from helpers_batch import ctx, outcome, state
from tabletune.policies import make_policy
from tabletune.policies.nightjar import _Bandit


def run(p, b, tokens_per_s_of, steps):
    ks = []
    for _ in range(steps):
        st = state(b)
        k = p.decide(st).k
        ks.append(k)
        ms = 10.0
        tokens = tokens_per_s_of(k) * ms / 1000.0
        # accepted so that sum(accepted + 1) == tokens
        acc = [int(round(tokens / b)) - 1] * b
        p.observe(outcome(st, [k] * b, [max(a, 0) for a in acc], ms))
    return ks


def test_tries_every_arm_once_then_exploits_the_best():
    p = make_policy("nightjar:window=4,c=0.05", ctx())
    reward = {0: 400, 1: 800, 2: 1200, 3: 1600, 4: 800, 5: 400}
    ks = run(p, 4, lambda k: reward[k], 6 * 4 + 200)
    assert sorted(set(ks[:24])) == [0, 1, 2, 3, 4, 5]  # each arm held for a window
    assert ks[:4] == [ks[0]] * 4
    assert ks[-100:].count(3) > 90


def test_buckets_are_separate():
    p = make_policy("nightjar:window=2", ctx())
    run(p, 4, lambda k: 100 * (k + 1), 40)
    assert set(p.bandits) == {2}
    run(p, 100, lambda k: 100 * (k + 1), 4)
    assert set(p.bandits) == {2, 6}


def test_restart_penalty_keeps_speculation_off_when_close():
    b = _Bandit((0, 1))
    b.reward(0, 1.0)
    b.reward(1, 1.02)
    for _ in range(50):
        b.reward(0, 1.0)
        b.reward(1, 1.02)
    assert b.choose(0.0, current=0, restart_penalty=0.05) == 0
    assert b.choose(0.0, current=1, restart_penalty=0.05) == 1
