"""A draft loop's stop rule on the device (``tabletune.policies.stop_rule``; docs/engine.md, "A stop rule on the
device"): rows drop out as tensor operations behind the drafter, no host sync until the lengths are read."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tabletune.engine.ops import upload
from tabletune.policies.stop_rule import TOP1_CLIP, Z_CLIP, LogitStopRule


class DeviceStop:
    def __init__(self, engine, slots: Sequence[int], caps: np.ndarray, rule: LogitStopRule) -> None:
        dev = engine.device
        self.sig, self.k_max = engine.draft_sig, rule.k_max
        self.slots = upload(list(slots), dev)
        self.caps = upload(np.asarray(caps, np.int64), dev)
        self.slope = rule.slope
        self.intercepts = upload(list(rule.intercepts), dev, torch.float64)
        self.thetas = upload(list(rule.log_thresholds), dev, torch.float64)
        self.alive = self.caps > 0
        self.log_s = torch.zeros(len(slots), dtype=torch.float64, device=dev)
        self.drafted = torch.zeros(len(slots), dtype=torch.long, device=dev)
        self.cuda = dev.type == "cuda"
        self.flags = torch.ones(self.k_max + 1, dtype=torch.bool, pin_memory=self.cuda)
        self.events: list[torch.cuda.Event] = []

    @torch.inference_mode()
    def after_position(self, j: int) -> None:
        """Rows alive drafted position j (1-based): count it, then keep those whose rule lets them draft j + 1."""
        self.drafted += self.alive
        top1 = self.sig[self.slots, j - 1, 0].double().clamp(TOP1_CLIP, 1 - TOP1_CLIP)
        z = (self.slope * torch.log(top1 / (1 - top1)) + self.intercepts[j - 1]).clamp(-Z_CLIP, Z_CLIP)
        self.log_s -= torch.log1p(torch.exp(-z))
        if j >= self.k_max:
            self.alive.zero_()
        else:
            self.alive &= (self.log_s > self.thetas[j - 1]) & (self.caps > j)
        self.flags[j].copy_(self.alive.any(), non_blocking=True)
        if self.cuda:
            self.events.append(torch.cuda.Event())
            self.events[-1].record()

    def done(self) -> bool:
        """True once a flag that has arrived says no row is alive (rows never revive); never waits."""
        for j in range(len(self.events) if self.cuda else self.k_max, 0, -1):
            if (not self.cuda or self.events[j - 1].query()) and not bool(self.flags[j]):
                return True
        return False

    def lengths(self) -> np.ndarray:
        """[rows] positions each row drafted before its rule stopped it (one sync)."""
        return self.drafted.cpu().numpy()
