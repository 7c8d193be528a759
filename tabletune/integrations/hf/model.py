"""SmolLM2-135M on the CPU with transformers: target trajectories and per-position scores.

* ``generate``: the target's own continuation (greedy at temperature 0, pure sampling at T > 0:
  no top-k/top-p), batched with left padding, cut after the first end-of-turn token.
* ``score``: one teacher-forced forward over prompt + continuation with all hidden states. The
  target's distribution p_t comes from the last layer; the early-exit drafter's q_t from the
  first ``exit_layer`` layers + the final norm + the (tied) LM head. Along the trajectory the
  early-exit drafter's state equals the teacher-forced one (its KV cache is the target's first
  ``exit_layer`` layers), so this is what the drafter would see at every reached position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig


@dataclass(frozen=True)
class PositionScores:
    """Per output position t of one request (all arrays [num_tokens])."""

    accept_prob: np.ndarray  # greedy: [argmax q_t == y_t]; T > 0: min(1, q_t(y_t) / p_t(y_t))
    top1_prob: np.ndarray  # drafter's softmax (at T, or 1 when T == 0)
    entropy: np.ndarray  # nats
    margin: np.ndarray  # top-1 minus top-2 probability


class SmolLM2Runner:
    """A float32 HF causal LM folder, evaluated on the CPU without gradients."""

    def __init__(self, model_dir: Path, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.num_layers = self.model.config.num_hidden_layers

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list[list[int]]:
        """One continuation per prompt, up to and including the first end-of-turn token."""
        width = max(len(p) for p in prompts)
        # [batch_size, width], left-padded
        ids = torch.full((len(prompts), width), self.eos_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                  temperature=temperature if temperature > 0 else None, top_k=0 if temperature > 0 else None,
                                  top_p=1.0 if temperature > 0 else None, eos_token_id=self.eos_id,
                                  pad_token_id=self.eos_id)
        torch.manual_seed(seed)
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        result = []
        for row in out[:, width:].tolist():
            result.append(row[: row.index(self.eos_id) + 1] if self.eos_id in row else row)
        return result

    @torch.no_grad()
    def score(self, prompt: list[int], output: list[int], exit_layers: list[int],
              temperature: float) -> dict[int, PositionScores]:
        """Early-exit drafter scores at each output position, for each exit layer."""
        ids = torch.tensor([prompt + output])
        hidden = self.model.model(input_ids=ids, output_hidden_states=True)
        # output token t is predicted at sequence index len(prompt) - 1 + t
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(output))
        y = torch.tensor(output)
        target = self.model.lm_head(hidden.last_hidden_state[0, rows])  # [num_tokens, vocab]
        scores = {}
        for m in exit_layers:
            if not 1 <= m < self.num_layers:
                raise ValueError(f"exit layer {m} outside 1..{self.num_layers - 1}")
            draft = self.model.lm_head(self.model.model.norm(hidden.hidden_states[m][0, rows]))
            scores[m] = _position_scores(target, draft, y, temperature)
        return scores


def _position_scores(target: torch.Tensor, draft: torch.Tensor, y: torch.Tensor, temperature: float) -> PositionScores:
    """Acceptance probability of the drafter's token at each position, and its confidence features."""
    q = torch.softmax(draft / (temperature if temperature > 0 else 1.0), dim=-1)  # [num_tokens, vocab]
    if temperature > 0:
        log_p = torch.log_softmax(target / temperature, dim=-1).gather(1, y[:, None])[:, 0]
        log_q = torch.log(q.gather(1, y[:, None])[:, 0].clamp_min(1e-30))
        accept = torch.exp(torch.clamp(log_q - log_p, max=0.0))
    else:
        accept = (draft.argmax(dim=-1) == y).float()
    top2 = q.topk(2, dim=-1).values
    entropy = -(q * torch.log(q.clamp_min(1e-30))).sum(dim=-1)
    return PositionScores(accept_prob=accept.numpy(), top1_prob=top2[:, 0].numpy(), entropy=entropy.numpy(),
                          margin=(top2[:, 0] - top2[:, 1]).numpy())
