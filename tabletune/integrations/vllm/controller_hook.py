"""The online controller inside vLLM's engine core (plugin feature, off by default).

Turn it on with ``TABLETUNE_PROFILE=<dir written by tabletune tune>`` (it reads
``step_profile.json`` and ``acceptance.json`` there) and optionally
``TABLETUNE_CONTROLLER='{"explore_fraction": 0.05, ...}'`` (``ControllerConfig``
fields). vLLM must start in dynamic-SD mode, i.e. with a
``num_speculative_tokens_per_batch_size`` table in ``--speculative-config``: that
table is the starting point, and ``num_speculative_tokens`` is the largest k.

What it patches (idempotent; harmless in processes that never build a Scheduler):

* ``Scheduler.__init__``: after vLLM's own init, a ``ControllerHook`` attaches to
  the instance. It wraps ``make_spec_decoding_stats`` (called by
  ``update_from_output`` once per verified draft with its length and accepted
  count) to collect (k_i, m_i) pairs, and ``update_from_output`` to count the
  step. Every ``observe_every_steps`` steps (``ControllerConfig``, default 8) the
  pooled pairs become one ``StepObservation`` for ``tabletune.controller.Controller``
  and the controller may rebuild: the other steps cost a few microseconds, and
  the estimator's cost is amortised over the window.
* After each step, in the engine-core thread and before the next ``schedule()``,
  it sets ``scheduler.dynamic_sd_lookup`` to vLLM's own expansion
  (``build_dynamic_sd_schedule_lookup``) of the installed table, or to an
  all-k_max lookup on an exploration step.
* Each step it checks that the drafts honour the table (``table_check.DraftCheck``:
  ``table_honoured``, ``k_mismatch_steps`` in the state) and, when the profile folder
  holds a by-context table (``table_by_context.json``), installs the row for the
  scheduled requests' mean context (``table_check.ContextRows``; ``context_row``)
  until the controller installs a table of its own or a table is pinned.
* ``EngineCore.tabletune_state()`` and ``EngineCore.tabletune_set_table(ranges)``:
  utility methods for ``call_utility`` / ``call_utility_async``. The in-process
  client (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) gets a ``call_utility`` that calls
  the engine core directly, so the same call works offline in both modes.

Live override: with ``TABLETUNE_TABLE_FILE=<path>`` the hook polls that file after
each step, at most once a second (``tabletune.controller.table_file``): a valid table pins it, deleting the file
unpins, an invalid one is refused with one log line and the last good table stays.

Metrics: the hook publishes a snapshot for the ``tabletune_*`` series on vLLM's
``/metrics`` (``tabletune.integrations.vllm.metrics``) at most once a second, and at
every install, pin or refusal.

Fail-open: every exception inside the hook is caught, the scheduler keeps the
last good lookup, and each kind of error is logged once (counted in
``tabletune_state()['errors']``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tabletune.controller import Controller, load_controller
from tabletune.controller.estimator import StepObservation
from tabletune.controller.table_file import TableFileWatcher
from tabletune.integrations.vllm import metrics
from tabletune.integrations.vllm.table_check import ContextRows, DraftCheck, engine_description
from tabletune.table import ContextTable, DraftTable

Expand = Callable[[list[list[int]], int, int], list[int]]
BY_CONTEXT_FILE = "table_by_context.json"  # as ``tabletune.tuner.files`` writes it

PROFILE_ENV = "TABLETUNE_PROFILE"
OPTIONS_ENV = "TABLETUNE_CONTROLLER"
TABLE_FILE_ENV = "TABLETUNE_TABLE_FILE"
logger = logging.getLogger("tabletune.controller")

_installed = False
_status: dict = {"enabled": False, "reason": "not installed"}


def install() -> None:
    """Plugin entry: patch vLLM's classes when TABLETUNE_PROFILE is set."""
    global _installed
    if _installed or not os.environ.get(PROFILE_ENV, "").strip():
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import InprocClient

    original_init = Scheduler.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        try:
            attach(self)
        except Exception as exc:  # fail open: the engine runs without the controller
            _status.update(enabled=False, reason=f"attach failed: {exc!r}")
            logger.warning("tabletune: controller disabled: %r", exc)

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    Scheduler.__init__ = __init__
    try:  # the API server's /metrics reads what the engine core publishes
        metrics.register_collector(metrics.setup_dir())
    except Exception as exc:  # fail open: serving without tabletune_* series
        logger.warning("tabletune: metrics export disabled: %r", exc)
    EngineCore.tabletune_state = _engine_state  # type: ignore[attr-defined]
    EngineCore.tabletune_set_table = _engine_set_table  # type: ignore[attr-defined]
    if not hasattr(InprocClient, "call_utility"):
        InprocClient.call_utility = _inproc_call_utility  # type: ignore[attr-defined]
    _installed = True
    _status.update(reason="no scheduler built yet")


def attach(scheduler, expand: Expand | None = None) -> ControllerHook | None:
    """Build the controller for this scheduler and wrap its methods (once); ``expand``: see ``ControllerHook``."""
    if getattr(scheduler, "_tabletune_hook", None) is not None:
        return scheduler._tabletune_hook
    if not os.environ.get(PROFILE_ENV, "").strip():
        _status.update(enabled=False, reason=f"{PROFILE_ENV} is not set")
        return None
    spec = scheduler.vllm_config.speculative_config
    ranges = getattr(spec, "num_speculative_tokens_per_batch_size", None) if spec else None
    if not ranges or scheduler.dynamic_sd_lookup is None:
        _status.update(enabled=False, reason="vLLM was started without num_speculative_tokens_per_batch_size")
        logger.warning("tabletune: controller needs a num_speculative_tokens_per_batch_size table; disabled")
        return None
    max_batch = scheduler.scheduler_config.max_num_seqs
    table = DraftTable.from_ranges([list(r) for r in ranges]).clamped(scheduler.num_spec_tokens)
    profile_dir, by_context = by_context_table(os.environ[PROFILE_ENV])
    controller = load_controller(profile_dir, os.environ.get(OPTIONS_ENV, ""), table,
                                 scheduler.num_spec_tokens, max_batch, source=OPTIONS_ENV)
    hook = ControllerHook(scheduler, controller, expand)
    table_file = os.environ.get(TABLE_FILE_ENV, "").strip()
    if table_file:
        hook.watcher = TableFileWatcher(table_file, controller.k_max)
    folder = os.environ.get(metrics.METRICS_DIR_ENV, "").strip()
    if folder:
        rank = getattr(scheduler.vllm_config.parallel_config, "data_parallel_rank", 0) or 0
        hook.snapshot_file = metrics.snapshot_path(folder, rank)
        hook.engine_index = rank
    if by_context is not None:
        hook.rows = ContextRows(by_context, hook.lookup_for_ranges)
    hook.after_window(time.monotonic(), force_publish=True)
    scheduler._tabletune_hook = hook
    _status.update(enabled=True, reason="")
    logger.warning("tabletune: controller on, start table %s, k_max %d", table, controller.k_max)
    return hook


def by_context_table(profile_dir: str) -> tuple[str, ContextTable | None]:
    """A tune over several context lengths: its by-context table, and its smallest context's folder
    (the controller's profile); else (the folder, None)."""
    path = Path(profile_dir) / BY_CONTEXT_FILE
    if not path.is_file():
        return profile_dir, None
    table = ContextTable.load(path)
    own = Path(profile_dir) / "step_profile.json"
    return (profile_dir if own.is_file() else str(Path(profile_dir) / f"context-{table.rows[0].max_context_len}"),
            table)


class ControllerHook:
    """Per-scheduler glue: collect drafts, feed the controller, swap the lookup."""

    watcher: TableFileWatcher | None = None  # TABLETUNE_TABLE_FILE
    snapshot_file: Path | None = None  # where the metrics snapshot goes
    engine_index = 0
    check: DraftCheck | None = None
    rows: ContextRows | None = None  # a by-context table's rows, used until the controller rebuilds

    def __init__(self, scheduler, controller: Controller, expand: Expand | None = None) -> None:
        """``expand(ranges, max_batch, num_spec_tokens)``: the dense lookup of a table; vLLM's own
        ``build_dynamic_sd_schedule_lookup`` unless given (tests pass an equivalent without importing vLLM)."""
        if expand is None:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup as expand
        self._expand = expand
        self.scheduler = scheduler
        self.controller = controller
        self.max_batch = scheduler.scheduler_config.max_num_seqs
        self.num_spec_tokens = scheduler.num_spec_tokens
        self.table_lookup = self.lookup_for(controller.table)
        self.explore_lookup = self.lookup_for(DraftTable.fixed(controller.k_max))
        scheduler.dynamic_sd_lookup = self.table_lookup
        self.pairs: list[tuple[int, int]] = []  # (k_i, m_i) of the current window's verified drafts
        self.window: list[int] = []  # batch size of each step of the current window
        self.window_undrafted = 0  # decode request-steps of the window that verified no draft although k >= 1
        self.windows = 0  # observations handed to the controller
        self.last_k = 0  # k scheduled by the previous step: it sized this step's drafts
        self.enabled = True  # False: the installed table stays, nothing is observed (static-table baselines)
        self.errors: dict[str, int] = {}
        self.overhead_us: deque[float] = deque(maxlen=4096)
        self.overhead_total_s = 0.0
        self.totals = metrics.CumulativeDrafts(controller.k_max)
        self._next_publish_s = 0.0
        self.check = DraftCheck(self.num_spec_tokens, describe=engine_description)
        self._wrap()

    def use_controller(self, controller: Controller) -> None:
        """Start over with another controller (and its table), e.g. between benchmark runs."""
        self.controller = controller
        self.table_lookup = self.lookup_for(controller.table)
        self.explore_lookup = self.lookup_for(DraftTable.fixed(controller.k_max))
        self.scheduler.dynamic_sd_lookup = self.table_lookup
        self.pairs.clear()
        self.window.clear()
        self.window_undrafted = 0
        self.enabled = True

    def use_static(self, table: DraftTable) -> None:
        """Pause the controller and run this table as it is (a static baseline)."""
        self.table_lookup = self.scheduler.dynamic_sd_lookup = self.lookup_for(table)
        self.enabled = False

    def lookup_for(self, table: DraftTable) -> list[int]:
        """vLLM's own dense expansion of the ranges (validates them again)."""
        return self.lookup_for_ranges(table.as_lists())

    def lookup_for_ranges(self, ranges: list[list[int]]) -> list[int]:
        return self._expand(ranges, self.max_batch, self.num_spec_tokens)

    def _wrap(self) -> None:
        sched = self.scheduler
        make_stats, update = sched.make_spec_decoding_stats, sched.update_from_output
        pairs = self.pairs

        def make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                     num_invalid_spec_tokens, request_id):
            pairs.append((num_draft_tokens, num_accepted_tokens))
            return make_stats(spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                              request_id)

        def update_from_output(scheduler_output, model_runner_output):
            out = update(scheduler_output, model_runner_output)
            self.after_step(scheduler_output)
            return out

        sched.make_spec_decoding_stats = make_spec_decoding_stats
        sched.update_from_output = update_from_output

    def after_step(self, scheduler_output) -> None:
        """Count the step, observe and maybe rebuild once per window, choose the next lookup; never raises."""
        if not self.enabled:
            self.pairs.clear()
            self.window.clear()
            self.window_undrafted = 0
            return
        t0 = time.thread_time()  # CPU time of the engine-core thread: robust on a shared machine
        try:
            self._step(scheduler_output)
        except Exception as exc:  # fail open: keep the last good table
            self.scheduler.dynamic_sd_lookup = self.table_lookup
            self.pairs.clear()
            self.window.clear()
            self.window_undrafted = 0
            self._error(type(exc).__name__, exc)
        finally:
            dt = time.thread_time() - t0
            self.overhead_us.append(dt * 1e6)
            self.overhead_total_s += dt

    def _step(self, scheduler_output) -> None:
        c = self.controller
        batch_size = len(scheduler_output.num_scheduled_tokens)
        if batch_size == 0:
            return
        if self.check is not None:
            self.check.observe(self.last_k, map(len, scheduler_output.scheduled_spec_decode_tokens.values()))
        self.window.append(batch_size)
        if self.last_k >= 1:  # a request verifying no draft decodes exactly 1 token (n-gram found no match)
            self.window_undrafted += list(scheduler_output.num_scheduled_tokens.values()).count(1)
        self.last_k = k = getattr(scheduler_output, "num_spec_tokens_to_schedule", 0)
        now_s = time.monotonic()
        if len(self.window) >= c.config.observe_every_steps:
            self._observe_window(k, now_s)
        else:  # the table file is polled every step (at most once per second), not once a window
            self.after_window(now_s)
        explore = c.explore_next(batch_size)
        lookup = self.explore_lookup if explore else self.table_lookup
        if self.rows is not None and not explore and c.installs == 0 and c.pins == 0:
            requests = self.scheduler.requests
            lookup = self.rows.pick([requests[r].num_computed_tokens for r in scheduler_output.num_scheduled_tokens
                                     if r in requests]) or lookup
        self.scheduler.dynamic_sd_lookup = lookup

    def _observe_window(self, k: int, now_s: float) -> None:
        """One observation from the window's pooled drafts, then a (throttled) rebuild."""
        c = self.controller
        try:
            self.windows += 1
            obs = self.make_observation(self.window[-1], k, now_s)
            if c.observe(obs, self.window):
                self.totals.add(obs)
            else:
                self._error("ignored_observation", obs.problem())
        finally:
            self.pairs.clear()
            self.window.clear()
            self.window_undrafted = 0
        new = c.maybe_rebuild(now_s)
        if new is not None:
            self.table_lookup = self.lookup_for(new)
            logger.warning("tabletune: installed table %s after %d steps (predicted gain %.1f%%, acceptance %s)",
                           new, c.steps, 100 * c.last_gain, [round(r, 3) for r in c.estimator.rates()])
        self.after_window(now_s, force_publish=new is not None)

    def after_window(self, now_s: float, force_publish: bool = False) -> None:
        """Poll the table file, then publish the metrics snapshot (throttled)."""
        changed = self.watcher is not None and self._poll_table_file(now_s)
        if self.snapshot_file is not None and (force_publish or changed or now_s >= self._next_publish_s):
            self._next_publish_s = now_s + metrics.PUBLISH_S
            try:
                metrics.publish(self.snapshot_file, self.snapshot())
            except OSError as exc:  # fail open: serving goes on, the series go stale
                self._error("metrics_publish", exc)

    def _poll_table_file(self, now_s: float) -> bool:
        """Apply a pin, unpin or refusal from the watched file; True when something happened."""
        event = self.watcher.poll(now_s)
        if event is None:
            return False
        c = self.controller
        if event.kind == "unpin":
            c.unpin()
            logger.warning("tabletune: %s removed, controller unpinned (table %s)", self.watcher.path, c.table)
            return True
        if event.kind == "pin":
            try:
                lookup = self.lookup_for(event.table)  # vLLM's own validation before anything changes
            except Exception as exc:
                self.watcher.rejected += 1
                event = type(event)("invalid", problem=f"{self.watcher.path}: vLLM refused the table: {exc}")
            else:
                c.pin(event.table.as_lists(), now_s, source=str(self.watcher.path))
                self.table_lookup = self.scheduler.dynamic_sd_lookup = lookup
                logger.warning("tabletune: pinned table %s from %s", c.table, self.watcher.path)
                return True
        logger.warning("tabletune: table file refused, keeping %s: %s", c.table, " ".join(event.problem.split()))
        return True

    def make_observation(self, batch_size: int, k: int, now_s: float) -> StepObservation:
        """The window's drafts as one observation (batch_size, k: those of its last step)."""
        return StepObservation.from_drafts(batch_size, k, self.pairs, time_s=now_s, k_max=self.controller.k_max,
                                           undrafted=self.window_undrafted)

    def set_table(self, ranges) -> list[list[int]]:
        table = DraftTable.from_ranges(ranges, self.controller.k_max, source="tabletune_set_table")
        lookup = self.lookup_for(table)  # vLLM's own validation too, before anything changes
        self.controller.set_table(table.as_lists(), time.monotonic())
        self.table_lookup = self.scheduler.dynamic_sd_lookup = lookup
        return table.as_lists()

    def _error(self, kind: str, detail: object) -> None:
        n = self.errors.get(kind, 0)
        self.errors[kind] = n + 1
        if n == 0:
            logger.warning("tabletune: controller error %s (logged once, serving continues): %r", kind, detail)

    def snapshot(self) -> dict:
        """What the metrics export needs (cheap: no optimizer run)."""
        return {**self.state(light=True), **self.totals.as_dict(), "engine": self.engine_index,
                "table_file_rejected": self.watcher.rejected if self.watcher is not None else 0}

    def state(self, light: bool = False) -> dict:
        """The controller's state and the hook's; ``light`` (the metrics snapshot) skips the costly parts."""
        out = {**self.controller.state(light), "enabled": self.enabled, "errors": dict(self.errors),
               "overhead_total_s": self.overhead_total_s, "windows": self.windows,
               **(self.check.state() if self.check is not None else {}),
               "context_row": self.rows.row if self.rows is not None else None}
        if not light:
            us = sorted(self.overhead_us)
            out.update(lookup_k=self.scheduler.dynamic_sd_lookup[1:], overhead_steps=len(us),
                       overhead_us_median=us[len(us) // 2] if us else 0.0)
        return out


def _hook_of(core) -> ControllerHook | None:
    return getattr(getattr(core, "scheduler", None), "_tabletune_hook", None)


def _engine_state(self) -> dict:
    """EngineCore utility: the controller's state (table, acceptance, installs, steps, ...)."""
    hook = _hook_of(self)
    if hook is None:
        return dict(_status)
    try:
        return hook.state()
    except Exception as exc:
        hook._error("state", exc)
        return {"enabled": True, "errors": dict(hook.errors)}


def _engine_set_table(self, ranges) -> list[list[int]]:
    """EngineCore utility: validate and install a table now (bad ranges raise to the caller)."""
    hook = _hook_of(self)
    if hook is None:
        raise RuntimeError(f"tabletune controller is not running: {_status.get('reason')}")
    return hook.set_table(ranges)


def _inproc_call_utility(self, method: str, *args):
    """``call_utility`` for the in-process client: call the engine core directly."""
    return getattr(self.engine_core, method)(*args)
