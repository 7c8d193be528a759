"""Online adaptation: the head learns from each finished request's verified tokens, between requests.

Prequential: request r is first served (replayed, ``integrations.hf.eagle``) with the head as it is, then the
head takes ``steps`` AdamW steps on r's tokens with the target's features and distributions (which a server
has: the verify forward computes them for every verified token), with the training loss
(``train.batch_loss``). Verification never reads the head's weights, so serving stays lossless whatever the
head learns; only the drafts change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tabletune.drafter.train import TrainConfig, batch_loss


@dataclass(frozen=True)
class OnlineConfig:
    lr: float = 1e-4
    steps: int = 2  # optimizer steps per finished request
    k: int = 4

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.steps < 0 or self.k < 1:
            raise ValueError(f"bad online config {self}")


@dataclass(frozen=True)
class RequestResult:
    request: str
    workload: str
    reached_1: int  # drafts (all reach position 1)
    accepted_1: int
    accepted: int  # accepted draft tokens
    num_steps: int  # target forwards of the request
    update_ms: float  # the head's update after the request


def serve_stream(scorer, stream: list[tuple[str, str, float, list[int], list[int]]], cfg: OnlineConfig,
                 adapt: bool) -> list[RequestResult]:
    """Replay (id, workload, temperature, prompt, output) requests in order (each at the temperature its output
    was generated at), adapting the head after each if ``adapt``."""
    import numpy as np

    from tabletune.integrations.hf.replay import count, replay

    head = scorer.head
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    loss_cfg = TrainConfig(prompts="", out="")
    out = []
    for n, (rid, workload, temperature, prompt, output) in enumerate(stream):
        r = replay(rid, len(output), cfg.k, scorer.proposer(prompt, output, temperature, 2, 5),
                   np.random.default_rng([0, n]))
        c = count([r], cfg.k)
        batch = _batch(scorer, prompt, output) if adapt and len(output) > 2 else None
        t0 = time.perf_counter()  # the update alone: a server has the target's features from its verify steps
        if batch is not None:
            for _ in range(cfg.steps):
                loss, _ = batch_loss(head, scorer.embed, scorer.lm_head, batch, loss_cfg)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                opt.step()
        out.append(RequestResult(rid, workload, c.reached[0], c.accepted[0], sum(c.accepted), r.num_steps,
                                 (time.perf_counter() - t0) * 1e3))
    return out


@torch.no_grad()
def _batch(scorer, prompt: list[int], output: list[int]) -> dict:
    ids = torch.tensor([prompt + output])
    feats = scorer.runner.model.model(input_ids=ids).last_hidden_state
    mask = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
    mask[0, max(0, len(prompt) - 2): ids.shape[1] - 2] = True
    return {"ids": ids, "feats": feats, "mask": mask}
