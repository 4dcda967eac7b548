"""pass@1 on a task's held-out problems: one completion per problem, greedy by default. A problem
counts as solved when its reward is 1.0: full credit, where a task's verifier gives partial credit."""

from __future__ import annotations

from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from podsrl.rewards import accuracy_reward
from podsrl.rollout import cut_rows
from podsrl.tasks import Problem


def chat_prompt(tokenizer, system_prompt: str | None, question: str) -> str:
    """The prompt text: the tokenizer's chat template when it has one, else plain text."""
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt is not None else []) + [
        {"role": "user", "content": question}
    ]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['content']}\n\n" for m in messages if m['content'])


class Evaluation(NamedTuple):
    accuracy: float
    samples: list[dict]
    """The first ``keep`` problems of this process: question, answer, completion, correct."""


def evaluate(
    engine, tokenizer, problems: list[Problem], system_prompt: str | None, max_new_tokens: int,
    temperature: float = 0.0, accelerator=None, keep: int = 0, progress: bool = False,
) -> Evaluation:
    """Fraction of ``problems`` answered correctly, and the first ``keep`` completions. Under
    several processes each rank takes every world-size-th problem and the counts are summed
    across ranks. ``progress``: a bar of this process's problems, advanced per generated batch."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = problems[rank::world]
    scores, texts = [], []
    if mine:
        prompts = [chat_prompt(tokenizer, system_prompt, p.question) for p in mine]
        # generated shortest prompt first, so that the prompts of one batch are padded to similar
        # lengths; each problem keeps its own seed, whatever the order and however the problems are
        # split over processes (sampled evaluation is seeded to be repeatable)
        order = sorted(range(len(mine)), key=lambda i: len(prompts[i]))
        with torch.random.fork_rng(devices=[]), tqdm(total=len(mine), desc="eval", unit="problem",
                                                     disable=not progress, leave=False) as bar:
            torch.manual_seed(0)
            seeds = torch.randint(0, 2**62, (len(problems),)).tolist()[rank::world]
            out = engine.generate([prompts[i] for i in order], 1, temperature, max_new_tokens, seeds=[seeds[i] for i in order],
                                  on_chunk=lambda first, done, ids: bar.update(len(done)))
        texts, truncated = [""] * len(mine), [False] * len(mine)
        for i, text, cut in zip(order, out.texts, cut_rows(out, max_new_tokens, getattr(engine, "eos_ids", ()))):
            texts[i], truncated[i] = text, cut
        scores = accuracy_reward(texts, [p.answer for p in mine], [p.entry for p in mine],
                                 [p.require_marker for p in mine], [p.question for p in mine], truncated=truncated)
    counts = torch.tensor([sum(r == 1.0 for r in scores), len(mine)], dtype=torch.float64)
    if accelerator is not None and world > 1:
        counts = accelerator.reduce(counts.to(accelerator.device), reduction="sum").cpu()
    samples = [{"question": p.question, "answer": p.answer, "completion": t, "correct": r == 1.0}
               for p, t, r in zip(mine[:keep], texts, scores)]
    return Evaluation(float(counts[0] / counts[1].clamp(min=1)), samples)
