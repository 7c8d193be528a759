"""Train the EAGLE-1 head on the target's own continuations of the training prompts.

1. Data: for each training prompt, the target's greedy continuation and ``num_samples`` sampled ones
   (``chat_samples`` for chat prompts; T = 1, no top-k / top-p), generated in length-sorted batches until
   ``gen_budget_s`` is spent; the batches interleave code / chat and greedy / sampled, so a cut leaves a
   balanced set.
2. Features: one teacher-forced forward per batch gives f_j, the target's final-normed hidden state.
3. Loss at each continuation position j (the token j + 1 is a continuation token):

       pass 1:  h_j = head(embed(x_j), f_{j-1})
       pass p:  g_j = head(embed(x_j), out of pass p - 1 at j - 1)     (the head's own feature, as in draft step p)
       loss = sum over passes w_p * [ CE(softmax(lm_head(f_j)), lm_head(out_j)) + reg * smoothL1(out_j, f_j) ]

   CE is against the target's whole next-token distribution (soft labels), the regression is EAGLE's.
   ``pass_weights`` sets the passes: (1.0, 0.7) is the EAGLE-1 head's recipe; more passes are an EAGLE-3-style
   training-time test (Li et al. 2025, arXiv:2503.01840), approximated: pass p feeds the head its pass p - 1
   outputs at every position, so its attention sees pass-p keys where serving's sees the teacher-forced ones.
   EAGLE-3's fused low / mid / high target features are not used: they change the head's layout (vLLM loads
   them as ``eagle3``, with their own fc) and need the target's inner layers at every engine step.
4. AdamW, linear warm-up, cosine decay over the wall-clock ``train_budget_s``; the head is saved every
   ``checkpoint_s`` and at the end, with the log (loss and held-out top-1 agreement of every pass).
5. ``wall_budget_s`` bounds the whole command (from its start: loading, held-out trajectories, generation,
   features, training, saving): a config whose ``gen_budget_s + train_budget_s`` exceeds it is refused, and
   generation and training stop early, keeping ``SAVE_RESERVE_S`` for the last save, when the clock runs out.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tabletune import fileio
from tabletune.integrations.hf.eagle_head import EagleHead, HeadConfig, save_head
from tabletune.errors import InputError

SAVE_RESERVE_S = 10.0  # of ``wall_budget_s``, kept for the final save


def pass_weights(passes: int, decay: float) -> tuple[float, ...]:
    """w_p = decay^(p - 1) for p = 1 .. passes: (1.0, 0.7) for 2 passes at decay 0.7."""
    if passes < 1 or not 0 < decay <= 1:
        raise InputError("drafter train", "passes/pass_decay", (passes, decay), "need passes >= 1, 0 < decay <= 1")
    return tuple(round(decay ** p, 6) for p in range(passes))


@dataclass(frozen=True)
class LossConfig:
    """The loss of the module docstring: the regression weight and one weight per pass (pass p >= 2 feeds the head
    its own pass p - 1 outputs as features: a training-time test of p - 1 draft steps)."""

    reg_weight: float = 0.5
    pass_weights: tuple[float, ...] = (1.0, 0.7)


@dataclass(frozen=True)
class TrainConfig:
    prompts: str  # .jsonl of {id, workload, source, ids}
    out: str
    max_new_tokens: int = 192
    num_samples: int = 1  # sampled continuations per prompt, beside the greedy one
    chat_samples: int | None = None  # sampled continuations per chat prompt (default: num_samples)
    gen_batch: int = 512
    gen_budget_s: float = 150.0
    train_budget_s: float = 180.0
    max_steps: int | None = None
    batch_tokens: int = 8192
    lr: float = 1e-3
    warmup_steps: int = 50
    reg_weight: float = 0.5
    pass_weights: tuple[float, ...] = (1.0, 0.7)
    val_fraction: float = 0.02
    checkpoint_s: float = 60.0
    seed: int = 0
    eval_prompts: str | None = None  # .jsonl like ``prompts``: held-out prompts whose trajectories are saved
    eval_max_new_tokens: int = 256
    wall_budget_s: float | None = None  # the whole command, from its start (None: no bound)
    log_every: int = 50  # steps between "step" log records

    def __post_init__(self) -> None:
        checks = [("max_new_tokens", self.max_new_tokens >= 1), ("num_samples", self.num_samples >= 0),
                  ("gen_batch", self.gen_batch >= 1), ("batch_tokens", self.batch_tokens >= 16),
                  ("lr", self.lr > 0), ("pass_weights", len(self.pass_weights) >= 1),
                  ("val_fraction", 0 <= self.val_fraction < 0.5),
                  ("chat_samples", self.chat_samples is None or self.chat_samples >= 0),
                  ("warmup_steps", self.warmup_steps >= 1), ("checkpoint_s", self.checkpoint_s > 0),
                  ("log_every", self.log_every >= 1)]
        for name, ok in checks:
            if not ok:
                raise InputError("drafter train", name, getattr(self, name), "out of range")
        need = self.gen_budget_s + self.train_budget_s + SAVE_RESERVE_S
        if self.wall_budget_s is not None and need > self.wall_budget_s:
            raise InputError("drafter train", "wall_budget_s", self.wall_budget_s,
                             f"gen_budget_s + train_budget_s + {SAVE_RESERVE_S:g} s to save = {need:g} s exceed it")

    @property
    def loss(self) -> LossConfig:
        return LossConfig(self.reg_weight, self.pass_weights)


# Named recipes: TrainConfig fields that ``tabletune drafter train --recipe NAME`` sets (flags given override them).
RECIPES: dict[str, dict] = {
    # the committed head (profiles/drafters/smollm2-135m-eagle): 130 s of generation, 200 s of training
    "eagle1-200s": {"gen_batch": 1024, "gen_budget_s": 130.0, "train_budget_s": 200.0},
    # one H200 command of at most 10 minutes: twice the chat continuations, a longer schedule, a 3-pass training-time
    # test; 200 s generation + 300 s training (cut to what is left) + start, held-out continuations, features and
    # saves <= 560 s, which leaves the device call (10 minutes) time for imports and its own start
    "h200-10min": {"gen_batch": 1024, "gen_budget_s": 200.0, "train_budget_s": 300.0, "num_samples": 1,
                   "chat_samples": 3, "pass_weights": (1.0, 0.7, 0.49), "warmup_steps": 100,
                   "wall_budget_s": 560.0},
}


def read_prompts(path: Path) -> tuple[dict, list[dict]]:
    """The header line ({"eos_id": ...}) and the prompt records of a prompts .jsonl."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or "eos_id" not in lines[0]:
        raise InputError(str(path), "eos_id", None, "the first line must be the header {\"eos_id\": ...}")
    for n, rec in enumerate(lines[1:], start=2):
        if not isinstance(rec.get("ids"), list) or not rec["ids"]:
            raise InputError(str(path), f"line {n}.ids", rec.get("ids"), "must be a non-empty list of token ids")
    return lines[0], lines[1:]


@torch.no_grad()
def generate(target, jobs: list[tuple[dict, int]], cfg: TrainConfig, eos_id: int, log,
             deadline: float = math.inf) -> list[dict]:
    """Continuations for (prompt, sample index) jobs (index 0 greedy); stops starting batches after the budget
    (or at the ``deadline``, a ``time.monotonic()`` instant)."""
    dev = target.device
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i][0]["ids"]))
    batches = [order[i: i + cfg.gen_batch] for i in range(0, len(order), cfg.gen_batch)]
    random.Random(cfg.seed).shuffle(batches)
    t0, seqs = time.monotonic(), []
    for n, batch in enumerate(batches):
        if time.monotonic() - t0 > cfg.gen_budget_s or time.monotonic() > deadline:
            log({"event": "gen_budget_spent", "batches_done": n, "batches": len(batches)})
            break
        for greedy in (True, False):
            rows = [i for i in batch if (jobs[i][1] == 0) == greedy]
            if rows:
                seqs += _generate_rows(target, [jobs[i] for i in rows], greedy, cfg, eos_id, dev, cfg.seed + n)
        log({"event": "gen_batch", "n": n, "seqs": len(seqs), "elapsed_s": round(time.monotonic() - t0, 1)})
    return seqs


def _generate_rows(target, rows, greedy, cfg, eos_id, dev, seed) -> list[dict]:
    from transformers import GenerationConfig

    width = max(len(r["ids"]) for r, _ in rows)
    ids = torch.full((len(rows), width), eos_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (r, _) in enumerate(rows):
        ids[i, width - len(r["ids"]):] = torch.tensor(r["ids"])
        mask[i, width - len(r["ids"]):] = 1
    gc = GenerationConfig(max_new_tokens=cfg.max_new_tokens, do_sample=not greedy, temperature=None if greedy else 1.0,
                          top_k=None if greedy else 0, top_p=None if greedy else 1.0, eos_token_id=eos_id,
                          pad_token_id=eos_id)
    torch.manual_seed(seed)
    out = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc)[:, width:].tolist()
    result = []
    for (r, s), cont in zip(rows, out):
        cont = cont[: cont.index(eos_id) + 1] if eos_id in cont else cont
        result.append({"id": r["id"], "workload": r["workload"], "sample": s, "prompt_len": len(r["ids"]),
                       "ids": r["ids"] + cont})
    return result


@torch.no_grad()
def feature_batches(target, seqs: list[dict], batch_tokens: int, eos_id: int) -> list[dict]:
    """Length-sorted right-padded batches with the target's final-normed hidden states (bf16 on the device)."""
    dev = target.device
    seqs = sorted(seqs, key=lambda s: len(s["ids"]))
    batches, i = [], 0
    while i < len(seqs):
        n = 1
        while i + n < len(seqs) and (n + 1) * len(seqs[i + n]["ids"]) <= batch_tokens:
            n += 1
        group = seqs[i: i + n]
        i += n
        width = len(group[-1]["ids"])
        ids = torch.full((len(group), width), eos_id, dtype=torch.long)
        # mask[:, j] = 1 where input position j + 1 predicts a continuation token j + 2 inside the sequence
        mask = torch.zeros(len(group), width - 1, dtype=torch.bool)
        for r, s in enumerate(group):
            ids[r, : len(s["ids"])] = torch.tensor(s["ids"])
            mask[r, max(0, s["prompt_len"] - 2): len(s["ids"]) - 2] = True
        ids = ids.to(dev)
        feats = target.model(input_ids=ids).last_hidden_state.to(torch.bfloat16)
        batches.append({"ids": ids, "feats": feats, "mask": mask.to(dev)})
    return batches


def batch_loss(head: EagleHead, embed: torch.Tensor, lm_head: torch.Tensor, batch: dict, cfg: LossConfig,
               with_stats: bool = True):
    """-> total loss, and per pass (top-1 agreement with the target, CE) on the masked positions (``with_stats``
    False: no stats, and no host sync: an update on a side CUDA stream must not wait for the GPU)."""
    ids, f, mask = batch["ids"], batch["feats"], batch["mask"]
    b, width = ids.shape
    pos = torch.arange(1, width, device=ids.device).expand(b, -1)
    emb = embed[ids[:, 1:]].to(f.dtype)  # bf16 features: mixed precision (training); float32: plain (online)
    target_f = f[:, 1:]
    with torch.no_grad():
        p = torch.softmax(F.linear(target_f[mask], lm_head).float(), -1)
        top1 = p.argmax(-1)
    feat_in, total, stats = f[:, :-1], 0.0, []
    for w in cfg.pass_weights:
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=f.dtype == torch.bfloat16):
            h = head(emb, feat_in, pos)
            logits = F.linear(h[mask], lm_head).float()
        logq = torch.log_softmax(logits, -1)
        ce = -(p * logq).sum(-1).mean()
        reg = F.smooth_l1_loss(h[mask].float(), target_f[mask].float())
        total = total + w * (ce + cfg.reg_weight * reg)
        if with_stats:
            stats.append(((logits.argmax(-1) == top1).float().mean().item(), ce.item()))
        feat_in = torch.cat([f[:, :1], h[:, :-1].to(f.dtype)], 1)
    return total, stats


def train(target, records: list[dict], eos_id: int, cfg: TrainConfig, log, deadline: float = math.inf) -> EagleHead:
    """The whole recipe (module docstring) on ``target`` (a transformers Llama); returns the trained head.
    ``deadline`` (a ``time.monotonic()`` instant): the end of the wall budget, less the final save's reserve."""
    torch.manual_seed(cfg.seed)
    dev = target.device
    chat = cfg.num_samples if cfg.chat_samples is None else cfg.chat_samples
    jobs = [(r, s) for r in records for s in range(1 + (chat if r.get("workload") == "chat" else cfg.num_samples))]
    seqs = generate(target, jobs, cfg, eos_id, log, deadline)
    rng = random.Random(cfg.seed)
    rng.shuffle(seqs)
    n_val = int(len(seqs) * cfg.val_fraction)
    train_b = feature_batches(target, seqs[n_val:], cfg.batch_tokens, eos_id)
    val_b = feature_batches(target, seqs[:n_val], cfg.batch_tokens, eos_id) if n_val else []
    n_tok = sum(int(b["mask"].sum()) for b in train_b)
    log({"event": "data", "sequences": len(seqs), "val_sequences": n_val, "train_tokens": n_tok,
         "by_workload": _count(seqs, "workload"), "greedy": sum(s["sample"] == 0 for s in seqs)})
    head = EagleHead(HeadConfig.from_llama(target.config.to_dict())).to(dev)
    head.reset_parameters()
    embed = target.model.embed_tokens.weight.detach()
    lm_head = target.lm_head.weight.detach().to(torch.bfloat16)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    t0 = last_ckpt = time.monotonic()
    budget_s = min(cfg.train_budget_s, deadline - t0)
    if budget_s < cfg.train_budget_s:
        log({"event": "train_budget_cut", "train_budget_s": round(budget_s, 3), "by": "wall_budget_s"})
    step, epoch = 0, 0
    last_loss = math.nan  # the last step's loss, in the "done" record
    if not train_b or budget_s <= 0:
        log({"event": "done", "steps": 0, "epochs": 0, "train_s": 0.0, "why": "no data" if not train_b else "no time"})
        return head
    while True:
        order = list(range(len(train_b)))
        rng.shuffle(order)
        for i in order:
            frac = (time.monotonic() - t0) / budget_s if budget_s > 0 else 1.0
            if frac >= 1 or (cfg.max_steps is not None and step >= cfg.max_steps):
                log({"event": "done", "steps": step, "epochs": epoch, "train_s": round(time.monotonic() - t0, 1),
                     "loss": round(last_loss, 4)})
                return head
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss, stats = batch_loss(head, embed, lm_head, train_b[i], cfg.loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            last_loss = loss.item()
            if step % cfg.log_every == 0 or step == 1:
                log({"event": "step", "step": step, "epoch": epoch, "lr": lr, "loss": round(loss.item(), 4),
                     "top1": [round(a, 4) for a, _ in stats], "elapsed_s": round(time.monotonic() - t0, 1)})
            if time.monotonic() - last_ckpt > cfg.checkpoint_s:
                last_ckpt = time.monotonic()
                log({"event": "val", "step": step, **evaluate(head, embed, lm_head, val_b, cfg)})
                save_head(head, Path(cfg.out) / "head", {"step": step, "partial": True})
        epoch += 1


@torch.no_grad()
def evaluate(head, embed, lm_head, batches, cfg) -> dict:
    """Held-out (val split) top-1 agreement and CE of each pass, token-weighted."""
    if not batches:
        return {}
    sums, n = None, 0
    for b in batches:
        _, stats = batch_loss(head, embed, lm_head, b, cfg.loss)
        k = int(b["mask"].sum())
        vals = [v for s in stats for v in s]
        sums = [k * v for v in vals] if sums is None else [a + k * v for a, v in zip(sums, vals)]
        n += k
    return {"val_top1": [round(sums[2 * i] / n, 4) for i in range(len(cfg.pass_weights))],
            "val_ce": [round(sums[2 * i + 1] / n, 4) for i in range(len(cfg.pass_weights))], "val_tokens": n}


def eval_trajectories(target, path: Path, cfg: TrainConfig, eos_id: int, out: Path) -> None:
    """The target's greedy (T=0) and sampled (T=1) continuations of held-out prompts, in full float32 (no TF32),
    as ``{"T0": {workload: [{id, prompt, output}]}, "T1": ...}``: the trajectories the CPU acceptance scoring reuses."""
    _, records = read_prompts(path)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    result: dict = {}
    try:
        for name, greedy in (("T0", True), ("T1", False)):
            ecfg = TrainConfig(prompts=cfg.prompts, out=cfg.out, max_new_tokens=cfg.eval_max_new_tokens)
            rows = _generate_rows(target, [(r, 0) for r in records], greedy, ecfg, eos_id, target.device, cfg.seed)
            by: dict = {}
            for r in rows:
                by.setdefault(r["workload"], []).append(
                    {"id": r["id"], "prompt": r["ids"][: r["prompt_len"]], "output": r["ids"][r["prompt_len"]:]})
            result[name] = by
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    fileio.write_json(out, {"max_new_tokens": cfg.eval_max_new_tokens, **result})


def _count(seqs, key) -> dict:
    out: dict = {}
    for s in seqs:
        out[s[key]] = out.get(s[key], 0) + 1
    return out


def run(cfg: TrainConfig, target, meta: dict, started: float | None = None) -> Path:
    """Train, then save the head, the log and the run's metadata under ``cfg.out``. ``started``: the command's
    start (``time.monotonic()``), from which ``wall_budget_s`` counts (default: now)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    t_start = time.monotonic() if started is None else started
    deadline = math.inf if cfg.wall_budget_s is None else t_start + cfg.wall_budget_s - SAVE_RESERVE_S

    def log(rec: dict) -> None:
        rec = {"t_s": round(time.monotonic() - t_start, 1), **rec}
        print(json.dumps(rec), flush=True)
        with open(log_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    header, records = read_prompts(Path(cfg.prompts))
    log({"event": "start", "prompts": len(records), "config": asdict(cfg)})
    if cfg.eval_prompts:
        eval_trajectories(target, Path(cfg.eval_prompts), cfg, int(header["eos_id"]), out / "eval_trajectories.json")
        log({"event": "eval_trajectories", "path": str(out / "eval_trajectories.json")})
    head = train(target, records, int(header["eos_id"]), cfg, log, deadline)
    save_head(head, out / "head", {"config": asdict(cfg), **meta})
    fileio.write_json(out / "run.json", {"config": asdict(cfg), **meta, "wall_s": round(time.monotonic() - t_start, 1)})
    return out / "head"
