"""The trained EAGLE head as a drafter along a target trajectory (``tabletune acceptance --drafter eagle``).

At a draft that starts at output index i (the target has emitted y_0 .. y_{i-1}), the head has seen the
target's features f up to y_{i-1}'s position and runs as the engine and vLLM run it:

    draft 1:      h = head(embed(y_{i-1}), f at y_{i-2}'s position)   (the teacher-forced pass, computed once)
    draft j > 1:  h = head(embed(y_{i+j-2}), h of draft j - 1)        (its own feature; attends to the
                                                                        teacher-forced keys and its own)
    q_j = softmax(lm_head(h) / T)

A reached position j has all earlier drafts accepted, so their tokens are the trajectory's: the chain's
inputs are known before any logits, and the k LM-head rows of a draft run as one matmul. Acceptance:
T = 0, argmax q_j == y; T > 0, min(1, q_j(y) / p_j(y)) (``replay``'s module docstring).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tabletune.integrations.hf.eagle_head import load_head
from tabletune.errors import InputError
from tabletune.integrations.hf import ngram
from tabletune.integrations.hf.replay import Draft


class EagleScorer:
    """The head beside a ``model.SmolLM2Runner``'s target (its embedding and LM head)."""

    def __init__(self, runner, head_dir: Path) -> None:
        self.runner = runner
        self.head = load_head(Path(head_dir)).float()
        cfg = runner.model.config
        if (self.head.cfg.hidden_size, self.head.cfg.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
            raise InputError(str(head_dir), "head", (self.head.cfg.hidden_size, self.head.cfg.vocab_size),
                             f"does not fit the target (hidden size, vocabulary) {(cfg.hidden_size, cfg.vocab_size)}")
        self.embed = runner.model.model.embed_tokens.weight
        self.lm_head = runner.model.lm_head.weight

    @torch.no_grad()
    def proposer(self, prompt: list[int], output: list[int], temperature: float, ngram_min: int, ngram_max: int):
        """``propose(i, k) -> Draft`` along prompt + output (``replay.ProposeFn``)."""
        n = len(prompt)
        ids = torch.tensor(prompt + output)
        f = self.runner.model.model(input_ids=ids[None]).last_hidden_state  # [1, L, hidden]
        p_logits = self.lm_head_rows(f[0, n - 1: n - 1 + len(output)])  # row t predicts y_t
        pos = torch.arange(1, len(ids))[None]
        # teacher-forced pass: position p sees token p and f_{p-1}; its output stands in for f_p
        h1, (k1, v1) = self.head.forward_kv(self.embed[ids[1:]][None], f[:, :-1], pos)
        context = np.asarray(prompt + output, dtype=np.int64)
        y = torch.tensor(output)

        @torch.no_grad()
        def propose(i: int, k: int) -> Draft:
            q0 = n + i - 1  # position of y_{i-1}; its head output predicts y_i
            hs, h = [h1[:, q0 - 1]], h1[:, q0 - 1: q0]
            past = (k1[:, :, :q0], v1[:, :, :q0])
            for j in range(1, k):
                q = q0 + j
                h, past = self.head.forward_kv(self.embed[ids[q: q + 1]][None], h, torch.tensor([[q]]), past)
                hs.append(h[:, 0])
            logits = self.lm_head_rows(torch.cat(hs, 0))  # [k, vocab]
            rows = slice(i, i + k)
            scale = temperature if temperature > 0 else 1.0
            logq = torch.log_softmax(logits / scale, -1)
            qprob = logq.exp()
            if temperature > 0:
                logp = torch.log_softmax(p_logits[rows] / temperature, -1).gather(1, y[rows, None])[:, 0]
                accept = torch.exp(torch.clamp(logq.gather(1, y[rows, None])[:, 0] - logp, max=0.0))
            else:
                accept = (logits.argmax(-1) == y[rows]).float()
            top2 = qprob.topk(2, -1).values
            entropy = -(qprob * logq).sum(-1)
            nlen = ngram.longest_match(context[: n + i], ngram_min, ngram_max).n
            return Draft(accept_prob=accept.numpy(), top1_prob=top2[:, 0].numpy(), entropy=entropy.numpy(),
                         margin=(top2[:, 0] - top2[:, 1]).numpy(), ngram_len=nlen)

        return propose

    def lm_head_rows(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(h, self.lm_head)
