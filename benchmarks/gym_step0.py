"""Which reasoning-gym data sets the embedded model can learn: greedy pass@1 at step 0 on held-out
problems, per data set and setting, with what the extraction and the scoring cost.

    python benchmarks/gym_step0.py [--problems 200] [--only chain_sum,gcd] [--out results.json]

For each setting (:data:`SETTINGS`: each data set at reasoning-gym's default difficulty and at one
easier setting) it builds the gym task (seed 0), generates one greedy completion per held-out
problem with the embedded model (or ``model.name_or_path=...``), and reports pass@1 (the verifier's
full credit), the mean reward (partial credit included), the same verifier on the raw completion
(no extraction: what a reward that pays the tag format first would give this model), and the time
of scoring the completions through the reward pool and of the verifier alone. One evaluation at a
time; the rows are printed as they finish, as a markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from podsrl import models
from podsrl.config import load_config
from podsrl.evaluate import chat_prompt
from podsrl.rewards import accuracy_reward
from podsrl.rewards.pool import shutdown
from podsrl.rollout import make_engine
from podsrl.tasks import load_task
from podsrl.tasks.gym import _verifier

# (data set, easier settings or None for reasoning-gym's default, max_new_tokens); each easier
# setting keeps a held-out set of 200 within 1% of the generator's draws
SETTINGS = [
    ("chain_sum", None, 16),
    ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "allow_negation": True}, 16),
    ("basic_arithmetic", None, 16),
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+", "-"]}, 16),
    ("count_bits", None, 16),
    ("count_bits", {"max_n": 2**17 - 1}, 16),
    ("letter_counting", None, 16),
    ("letter_counting", {"min_words": 3, "max_words": 5}, 16),
    ("leg_counting", None, 16),
    ("leg_counting", {"min_animals": 2, "max_animals": 3, "max_instances": 5}, 16),
    ("gcd", None, 16),
    ("gcd", {"max_value": 200}, 16),
    ("spell_backward", None, 16),
    ("spell_backward", {"max_word_len": 6}, 16),
    ("base_conversion", None, 16),
    ("base_conversion", {"max_base": 10, "max_value": 255}, 16),
    ("syllogism", None, 16),
    ("syllogism", {"allow_some": False, "allow_some_not": False}, 16),
    ("word_sorting", None, 48),
    ("knights_knaves", None, 32),
]


def raw_verifier_mean(texts: list[str], problems) -> float:
    """The data set's verifier on each completion as generated (no answer extraction)."""
    values = []
    for text, p in zip(texts, problems):
        try:
            values.append(float(_verifier(p.entry["dataset"], p.entry["config"])(text, p.entry["entry"])))
        except Exception:  # noqa: BLE001 (a verifier that raises on raw text scores 0 here)
            values.append(0.0)
    return sum(values) / len(values)


def evaluate_setting(engine, tokenizer, name, settings, tokens, problems, system_prompt) -> dict:
    task = load_task("gym", dataset=name, config=settings or {}, test_size=problems, seed=0)
    system_prompt = task.system_prompt if system_prompt is None else system_prompt
    prompts = [chat_prompt(tokenizer, system_prompt, p.question) for p in task.test]
    start = time.perf_counter()
    texts = engine.generate(prompts, 1, 0.0, tokens).texts
    generation_s = time.perf_counter() - start
    start = time.perf_counter()
    rewards = accuracy_reward(texts, [p.answer for p in task.test], [p.entry for p in task.test])
    pool_s = time.perf_counter() - start
    start = time.perf_counter()
    raw = raw_verifier_mean(texts, task.test)
    verifier_s = time.perf_counter() - start
    return {
        "dataset": name, "config": settings or "default", "max_new_tokens": tokens, "problems": len(texts),
        "pass@1": sum(r == 1.0 for r in rewards) / len(rewards), "mean_reward": sum(rewards) / len(rewards),
        "raw_verifier_mean": raw, "generation_s": generation_s,
        "scoring_ms_per_completion": 1000 * pool_s / len(texts), "verifier_ms_per_completion": 1000 * verifier_s / len(texts),
        "examples": [{"question": p.question[-120:], "answer": p.answer, "completion": t} for p, t in zip(task.test[:3], texts)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated data sets (default: all of SETTINGS)")
    parser.add_argument("--system-prompt", default=None, help="instead of the gym task's")
    parser.add_argument("--out", default=None, help="write the rows as JSON here (a rerun skips the rows it holds)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.name_or_path=...")
    args = parser.parse_args()
    c = load_config(None, args.overrides)
    torch.manual_seed(0)
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype).eval()
    engine = make_engine("hf", model, tokenizer, c.rollout)
    only = set(filter(None, args.only.split(",")))
    rows = json.load(open(args.out)) if args.out and os.path.exists(args.out) else []  # a rerun goes on
    for name, settings, tokens in SETTINGS:
        if only and name not in only or any(r["dataset"] == name and r["config"] == (settings or "default") for r in rows):
            continue
        row = evaluate_setting(engine, tokenizer, name, settings, tokens, args.problems, args.system_prompt)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "examples"}), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    shutdown()
    print("\n| data set | settings | pass@1 | mean reward | verifier on the raw completion | scoring ms/completion (pool) | verifier ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        settings = "default" if r["config"] == "default" else ", ".join(f"{k}={v}" for k, v in r["config"].items())
        print(f"| {r['dataset']} | {settings} | {r['pass@1']:.3f} | {r['mean_reward']:.3f} | {r['raw_verifier_mean']:.3f} "
              f"| {r['scoring_ms_per_completion']:.2f} | {r['verifier_ms_per_completion']:.3f} |")


if __name__ == "__main__":
    main()
