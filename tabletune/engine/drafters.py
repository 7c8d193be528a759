"""Drafters: draft tokens per sequence on the device, inside the step's CUDA graph (docs/engine.md).

* ``NgramDrafter``: prompt lookup (as vLLM's ``ngram``): the latest earlier occurrence of the last n tokens
  (n = n_max..n_min) in the sequence's history; the k tokens that followed it are the drafts.
* ``ReplayDrafter``: proposes a recorded continuation; with the forced-rejection cap it replays measured acceptance.
* ``DraftModelDrafter``: a separate small decoder with its own KV cache.
* ``EagleDrafter``: EAGLE-style head (Li et al. 2024, arXiv:2401.15077): one decoder layer over
  fc([embed(token); target hidden]), the target's LM head.
* ``ParallelBlockDrafter``: DFlash-like: all k drafts from one forward of one layer over k positions.

Per drafted token a drafter writes the draft and the signals the policies read (``draft_signals``); the n-gram
drafter also writes its match length and real drafts into ``engine.draft_meta``. Draft-model and EAGLE-style
catch-up: the previous step's m + 1 emitted tokens are re-fed in one forward of width k + 1 before the single-token
positions; when more are pending than fit, the oldest are skipped (only acceptance suffers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tabletune.engine.kv_cache import KVCache
from tabletune.engine.model import Decoder, DecoderLayer, _param
from tabletune.engine.presets import ModelConfig


def draft_signals(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., 3] top-1 probability, entropy (nats), top-1 - top-2 margin of softmax(logits / T) (T = 1 at T = 0)."""
    p = torch.softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    top2 = p.topk(2, dim=-1).values
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return torch.stack([top2[..., 0], entropy, top2[..., 0] - top2[..., 1]], dim=-1)


@dataclass
class DraftSlots:
    """Where a drafter writes, per slot: the drafts, their signals and (sampling model drafters) their
    distributions; the engine's own arrays, or a drafter's private ones (a replay that only runs its cost)."""

    drafts: torch.Tensor  # [slots + 1, k_max] int64
    signals: torch.Tensor  # [slots + 1, k_max, 3] float32: top-1 probability, entropy, margin
    probs: torch.Tensor | None = None  # [slots + 1, k_max, V] float32


class Drafter:
    """``begin(slots, start, last, k)`` once a step for the rows that draft (catch-up, n-gram match; a drafter
    that makes all its drafts at once writes them here), then ``draft(slots, j)`` for position j + 1 of the rows
    still drafting. ``has_meta``: the drafter writes ``engine.draft_meta`` (n-gram match, proposals, runs)."""

    name = "none"
    has_probs = False
    has_meta = False

    def setup(self, engine) -> None:
        self.engine = engine
        self.out = DraftSlots(engine.drafts, engine.draft_sig)

    def prefill(self, slot: int, prompt: torch.Tensor, first_token: int, hidden: torch.Tensor) -> None:
        pass

    def begin(self, slots, start, last, k: int) -> None:
        pass

    def draft(self, slots, j: int) -> None:
        pass

    def host_lookup(self, slots: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The n-gram lookup before drafting, on the host: (match length, tokens proposed) of each row's next
        position (its sequence position ``positions``); None for a drafter without an n-gram chain to plan."""
        return None

    def lookup(self, slots, start, last, k: int) -> None:
        """Write the n-gram proposals (drafts and ``draft_meta``) of rows that take no model draft this step."""
        raise NotImplementedError(f"{self.name} has no n-gram lookup apart from drafting")

    def observe(self, slots, start, tokens, m, hidden) -> None:
        pass

    def reset(self, num_rows: int, context_len: int) -> None:
        """Slots 0 .. num_rows-1 put back at context_len (between timed steps)."""

    def _put(self, slots, j, logits: torch.Tensor) -> None:
        """Drafts, signals (and probabilities) of position(s) j from the draft logits [A, V] (or [A, k, V], j a
        slice)."""
        from tabletune.engine.verify import sample

        t = self.engine.temperature
        self.out.signals[slots, j] = draft_signals(logits, t)
        if t == 0:
            self.out.drafts[slots, j] = logits.argmax(-1)
            return
        probs = torch.softmax(logits.float() / t, dim=-1)
        self.out.drafts[slots, j] = sample(probs)
        if self.out.probs is not None:
            self.out.probs[slots, j] = probs


class NgramDrafter(Drafter):
    name = "ngram"
    has_meta = True

    def __init__(self, n_min: int = 1, n_max: int = 3) -> None:
        self.n_min, self.n_max = n_min, n_max

    def begin(self, slots, start, last, k):
        k = self.engine.k_max
        # [B, L]: tokens 0..start of each sequence (position start holds the last token)
        hist = self.engine.history[slots]
        b, length = hist.shape
        pos = torch.arange(length, device=hist.device)
        best = torch.full((b,), -1, dtype=torch.long, device=hist.device)
        match_len = torch.zeros_like(start)  # [B] the n of the longest suffix that matched
        for n in range(self.n_max, self.n_min - 1, -1):
            eq = torch.ones(b, length - n + 1, dtype=torch.bool, device=hist.device)
            for t in range(n):
                suffix_t = hist.gather(1, (start - n + 1 + t).clamp_min(0)[:, None])
                eq &= hist[:, t: length - n + 1 + t] == suffix_t
            ok = eq & (pos[: length - n + 1][None] <= (start - n)[:, None])
            found = torch.where(ok, pos[: length - n + 1][None], -1).max(1).values
            new = (best < 0) & (found >= 0)
            match_len = torch.where(new, n, match_len)
            best = torch.where(new, found + n, best)
        idx = torch.where(best >= 0, best, start)[:, None] + torch.arange(k, device=hist.device)
        self.out.drafts[slots] = hist.gather(1, torch.minimum(idx, start[:, None]))
        # the tokens that followed the match, up to the current one: start - best + 1 of them
        self.engine.draft_meta[slots, :2] = torch.stack(
            [match_len, torch.where(best >= 0, (start - best + 1).clamp(0, k), 0)], 1)


class ReplayDrafter(Drafter):
    """Proposes ``engine.oracle[slot, start+1 : start+1+k_max]`` (host fills the recorded tokens)."""

    name = "replay"

    def begin(self, slots, start, last, k):
        idx = start[:, None] + 1 + torch.arange(self.engine.k_max, device=start.device)
        self.out.drafts[slots] = self.engine.oracle[slots].gather(1, idx)


class _CatchUpDrafter(Drafter, nn.Module):
    """Drafters that re-feed the previous step's emitted tokens in ``begin``, then run one token a position from
    the hidden state they keep per slot (``_step``)."""

    def setup(self, engine) -> None:
        Drafter.setup(self, engine)
        s, w, dev = engine.cache.num_slots + 1, engine.k_max + 1, engine.device
        self.prev_tok = torch.zeros(s, w, dtype=torch.long, device=dev)
        self.prev_count = torch.ones(s, dtype=torch.long, device=dev)
        self.prev_start = torch.zeros(s, dtype=torch.long, device=dev)
        self.pos = torch.zeros(s, dtype=torch.long, device=dev)  # position of the last token fed
        self.has_probs = engine.temperature > 0

    def _pending(self, slots, k):
        """Tokens to re-feed, [B, k+1], their first position [B] and how many are real [B]."""
        w = k + 1
        c = self.prev_count[slots]
        off = (c - w).clamp_min(0)
        cols = (off[:, None] + torch.arange(w, device=c.device)).clamp_max(self.prev_tok.shape[1] - 1)
        return cols, self.prev_start[slots] + off, torch.minimum(c, torch.full_like(c, w))

    def begin(self, slots, start, last, k):
        cols, pos0, count = self._pending(slots, k)
        h = self._step(self.prev_tok[slots].gather(1, cols), self._pending_hidden(slots, cols), pos0, slots)
        self.h[slots] = h.gather(1, (count - 1)[:, None, None].expand(-1, 1, h.shape[-1]))[:, 0]
        self.pos[slots] = pos0 + count - 1

    def draft(self, slots, j):
        h = self.h[slots]
        if j > 0:  # feed the previous draft
            h = self._step(self.out.drafts[slots, j - 1][:, None], h[:, None], self.pos[slots] + j, slots)[:, 0]
            self.h[slots] = h
        self._put(slots, j, self._logits(h))

    def _pending_hidden(self, slots, cols):
        return None

    def observe(self, slots, start, tokens, m, hidden):
        k1 = tokens.shape[1]
        self.prev_tok[slots, :k1] = tokens
        self.prev_count[slots] = m + 1
        self.prev_start[slots] = start + 1

    def reset(self, num_rows, context_len):
        self.prev_count[:num_rows] = 1
        self.prev_start[:num_rows] = context_len


class DraftModelDrafter(_CatchUpDrafter):
    name = "draft_model"

    def __init__(self, model: Decoder) -> None:
        nn.Module.__init__(self)
        self.model = model

    def setup(self, engine) -> None:
        super().setup(engine)
        self.cache = self.model.new_cache(engine.cache.num_slots, engine.cache.max_len)
        m = self.model
        self.h = torch.zeros(engine.cache.num_slots + 1, m.cfg.hidden_size, dtype=m.dtype, device=m.device)

    def prefill(self, slot, prompt, first_token, hidden):
        dev = self.model.device
        s = torch.tensor([slot], device=dev)
        self.model(prompt[None], torch.zeros(1, dtype=torch.long, device=dev), s, self.cache, prefill_at=(0, slot))
        self.prev_tok[slot, 0] = first_token
        self.prev_count[slot] = 1
        self.prev_start[slot] = prompt.shape[0]

    def _step(self, toks, hid, pos, slots):
        return self.model(toks, pos, slots, self.cache)

    def _logits(self, h):
        return self.model.logits(h)


class EagleDrafter(_CatchUpDrafter):
    """EAGLE-style head: h' = layer(fc([embed(t); h])), next token = argmax(lm_head(norm(h'))).

    ``norms=False`` is the EAGLE-1 layout that vLLM loads and ``tabletune drafter train`` trains: no RMSNorm
    before the attention and none at the end (h' is the layer's residual output). ``weights.load_eagle_head``
    fills it from a trained head's folder."""

    name = "eagle"

    def __init__(self, target: Decoder, norms: bool = True) -> None:
        nn.Module.__init__(self)
        self.norms = norms
        cfg, dt, dev = target.cfg, target.dtype, target.device
        self.target = [target]  # not a submodule: its weights are the target's
        self.fc = _param(cfg.hidden_size, 2 * cfg.hidden_size, dtype=dt, device=dev)
        self.layer = DecoderLayer(cfg, dt, dev)
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dt, device=dev), requires_grad=False)

    def setup(self, engine) -> None:
        super().setup(engine)
        t = self.target[0]
        self.cache = _one_layer_cache(t, engine.cache.num_slots, engine.cache.max_len)
        self.prev_hid = torch.zeros(*self.prev_tok.shape, t.cfg.hidden_size, dtype=t.dtype, device=t.device)
        self.h = torch.zeros(self.prev_hid.shape[0], t.cfg.hidden_size, dtype=t.dtype, device=t.device)

    def _step(self, toks, hid, pos, slots, prefill_at=None):
        t = self.target[0]
        ops, eps = t.ops, t.cfg.rms_norm_eps
        x = t.ops.linear(torch.cat([t.embed[toks], hid], dim=-1), self.fc)
        h = ops.rms_norm(x, self.layer.in_norm, eps) if self.norms else x
        a = self.layer.attn(ops, h, pos, slots, self.cache.k[0], self.cache.v[0], prefill_at)
        h, x = ops.add_rms_norm(x, a, self.layer.post_norm, eps)
        if not self.norms:
            return x + self.layer.mlp(ops, h)
        h, x = ops.add_rms_norm(x, self.layer.mlp(ops, h), self.norm, eps)
        return h

    def _pending_hidden(self, slots, cols):
        return self.prev_hid[slots].gather(1, cols[..., None].expand(-1, -1, self.prev_hid.shape[-1]))

    def _logits(self, h):
        return self.target[0].logits(h)

    def prefill(self, slot, prompt, first_token, hidden):
        n = prompt.shape[0]
        if n > 1:
            s = torch.tensor([slot], device=prompt.device)
            self._step(prompt[None, 1:], hidden[None, : n - 1], torch.ones(1, dtype=torch.long,
                       device=prompt.device), s, prefill_at=(1, slot))
        self.prev_tok[slot, 0] = first_token
        self.prev_hid[slot, 0] = hidden[n - 1]
        self.prev_count[slot] = 1
        self.prev_start[slot] = n

    def observe(self, slots, start, tokens, m, hidden):
        super().observe(slots, start, tokens, m, hidden)
        self.prev_hid[slots, : tokens.shape[1]] = hidden


class ParallelBlockDrafter(Drafter, nn.Module):
    """DFlash-like block drafter (arXiv:2602.06036 in spirit): k mask positions, one causal layer, one forward.

    x_j = h_last + embed(last token) + pos_j; the layer attends within the block only.
    """

    name = "parallel_block"

    def __init__(self, target: Decoder, k_max: int) -> None:
        nn.Module.__init__(self)
        cfg, dt, dev = target.cfg, target.dtype, target.device
        self.target = [target]
        self.pos_emb = _param(max(k_max, 1), cfg.hidden_size, dtype=dt, device=dev, std=0.02)
        self.layer = DecoderLayer(cfg, dt, dev)
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dt, device=dev), requires_grad=False)

    def setup(self, engine) -> None:
        Drafter.setup(self, engine)
        t = self.target[0]
        self.cache = _one_layer_cache(t, engine.cache.num_slots, max(engine.k_max, 1))
        self.feat = torch.zeros(engine.cache.num_slots + 1, t.cfg.hidden_size, dtype=t.dtype, device=t.device)
        self.has_probs = engine.temperature > 0

    def prefill(self, slot, prompt, first_token, hidden):
        self.feat[slot] = hidden[-1]

    def begin(self, slots, start, last, k):
        t = self.target[0]
        ops, eps = t.ops, t.cfg.rms_norm_eps
        x = (self.feat[slots] + t.embed[last])[:, None] + self.pos_emb[:k][None]
        h = ops.rms_norm(x, self.layer.in_norm, eps)
        zero = torch.zeros_like(start)
        a = self.layer.attn(ops, h, zero, slots, self.cache.k[0], self.cache.v[0])
        h, x = ops.add_rms_norm(x, a, self.layer.post_norm, eps)
        h, _ = ops.add_rms_norm(x, self.layer.mlp(ops, h), self.norm, eps)
        self._put(slots, slice(0, k), t.logits(h))

    def observe(self, slots, start, tokens, m, hidden):
        self.feat[slots] = hidden.gather(1, m[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]


def _one_layer_cache(t: Decoder, num_slots: int, max_len: int) -> KVCache:
    c = t.cfg
    return KVCache(1, num_slots, c.num_kv_heads, max_len, c.head_dim, t.dtype, t.device)


def make_drafter(name: str, target: Decoder, k_max: int, draft_cfg: ModelConfig | None = None,
                 draft_model: Decoder | None = None, head: str | None = None) -> Drafter:
    """``head``: a trained EAGLE head's folder (eagle); without it the head has random weights (timing only)."""
    if name == "ngram":
        return NgramDrafter()
    if name == "replay":
        return ReplayDrafter()
    if name == "eagle":
        if head is None:
            return EagleDrafter(target)
        from tabletune.engine.weights import load_eagle_head

        drafter = EagleDrafter(target, norms=False)
        load_eagle_head(drafter, head)
        return drafter
    if name == "parallel_block":
        return ParallelBlockDrafter(target, k_max)
    if name == "draft_model":
        if draft_model is None:
            draft_model = Decoder(draft_cfg, target.dtype, target.device, ops=target.ops)
        return DraftModelDrafter(draft_model)
    raise ValueError(f"unknown drafter {name!r}; choose ngram, replay, eagle, parallel_block, draft_model")
