"""The partial profile: an interrupted tune resumes without re-measuring what it has; settings must match."""

from __future__ import annotations

import json

import pytest

from tabletune.errors import InputError
from tabletune.tuner import TunePlan
from tabletune.tuner.checkpoint import FILE, Checkpoint
from tabletune.tuner.run import run_contexts

from tuner_fakes import FakeEngine

PLAN = TunePlan(batch_sizes=(1, 4, 16), ks=(0, 1, 2, 3), steps_per_call=4, min_samples=4, point_budget_s=1.0,
                refine=False, close_call_windows=0, recheck_passes=0)
SETTINGS = {"model": "m", "batch_sizes": [1, 4, 16]}


class Interrupted(Exception):
    pass


class DyingEngine(FakeEngine):
    """Dies at its ``die_at``-th measure_step call (a crash or an OOM mid-tune)."""

    def __init__(self, die_at: int) -> None:
        super().__init__()
        self.die_at = die_at

    def measure_step(self, batch_size, k, num_steps):
        if len(self.calls) + 1 == self.die_at:
            raise Interrupted
        return super().measure_step(batch_size, k, num_steps)


def test_resume_keeps_measured_batch_sizes_and_matches_an_uninterrupted_run(tmp_path):
    whole = run_contexts(FakeEngine(), PLAN, ["p"], [100])[0].profile
    folder = tmp_path / "out.partial"
    cp = Checkpoint.open(folder, SETTINGS, resume=False)
    dying = DyingEngine(die_at=6)  # b=1 takes 4 calls (one per k): it dies during b=4
    with pytest.raises(Interrupted):
        run_contexts(dying, PLAN, ["p"], [100], checkpoint=cp)
    kinds = [json.loads(line)["kind"] for line in (folder / FILE).read_text().splitlines()]
    assert kinds == ["start", "acceptance", "point", "point", "point", "point"]  # b=1's four k

    resumed = Checkpoint.open(folder, SETTINGS, resume=True)
    assert resumed.acceptance is not None and sorted(resumed.done_points(100)) == [(1, k) for k in range(4)]
    engine = FakeEngine()
    profile = run_contexts(engine, PLAN, ["p"], [100], checkpoint=resumed)[0].profile
    assert {b for b, _, _ in engine.calls} == {4, 16}  # b=1 is not measured again
    assert {(p.batch_size, p.k): p.samples_ms for p in profile.points} == \
        {(p.batch_size, p.k): p.samples_ms for p in whole.points}


def test_a_torn_last_line_is_ignored(tmp_path):
    cp = Checkpoint.open(tmp_path / "c", SETTINGS, resume=False)
    run_contexts(FakeEngine(), PLAN, ["p"], [100], checkpoint=cp)
    with open(tmp_path / "c" / FILE, "a") as f:
        f.write('{"kind": "point", "context_len": 100, "batch_si')
    assert len(Checkpoint.open(tmp_path / "c", SETTINGS, resume=True).done_points(100)) == 12


def test_resume_refuses_other_settings_and_fresh_runs_refuse_a_leftover(tmp_path):
    cp = Checkpoint.open(tmp_path / "c", SETTINGS, resume=False)
    run_contexts(FakeEngine(), PLAN, ["p"], [100], checkpoint=cp)
    with pytest.raises(InputError, match=r"settings.batch_sizes.*resume with the same options"):
        Checkpoint.open(tmp_path / "c", {**SETTINGS, "batch_sizes": [1, 2]}, resume=True)
    with pytest.raises(InputError, match="pass --resume"):
        Checkpoint.open(tmp_path / "c", SETTINGS, resume=False)
    with pytest.raises(InputError, match="no points.jsonl"):
        Checkpoint.open(tmp_path / "nothing", SETTINGS, resume=True)


def test_nothing_is_written_before_the_first_measurement(tmp_path):
    Checkpoint.open(tmp_path / "c", SETTINGS, resume=False)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("bad", ['{"kind": "point", "context_len": 100, "batch_si',  # torn, then more lines
                                 '{"kind": "point", "context_len": 100}',  # JSON, fields missing
                                 '{"kind": "point", "context_len": 100, "batch_size": 2, "k": 1, "samples_ms": 3}'])
def test_a_corrupted_line_in_the_middle_is_refused_with_its_line_number(tmp_path, bad):
    cp = Checkpoint.open(tmp_path / "c", SETTINGS, resume=False)
    run_contexts(FakeEngine(), PLAN, ["p"], [100], checkpoint=cp)
    path = tmp_path / "c" / FILE
    lines = path.read_text().splitlines()
    lines.insert(5, bad)  # after start, acceptance and three points
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        Checkpoint.open(tmp_path / "c", SETTINGS, resume=True)
    assert err.value.field == "line 6" and str(path) in str(err.value) and "\n" not in str(err.value)
