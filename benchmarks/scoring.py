"""Scoring speed: podsrl's accuracy reward against plain serial math-verify, side by side.

Builds, with a fixed seed, 1,024 GSM8K-style completions, 64 per prompt for 16 GSM8K test
questions (correct, wrong, rambling, no answer, in several formats), a second batch where
about 1% of them are pathological (a factorial of 10^21, deeply nested parentheses, a power
tower): completions small models really produce, on which math-verify stalls; and a third where
every completion goes on after its answer on the same line ("The answer is 42. I hope it is
correct."), as small models do when they run to the token limit.

Two paths score each batch:
  * serial math-verify: ``verify(parse(gold), parse(completion))`` per completion, math-verify's
    own defaults (its 5 s SIGALRM timeout) - what a reward function built on it does;
  * podsrl: ``accuracy_reward(completions, answer=golds)`` - plain numbers decided in-process,
    the rest in the reward pool's workers, each completion bounded by ``--timeout`` seconds.

Printed per batch: total time, the slowest single completion (each completion scored alone:
serial path timed one by one; podsrl's fast path timed in-process and its pool path as one task on
the idle pool, the kill of an overrunning worker included), how many non-pathological completions
the two paths scored differently (``differ``), how many pathological completions podsrl still sent
to the reward pool (``bad pool``: each costs a worker up to the bound) and on how many
non-pathological ones its rule against implausible answers fired (``rule ok``). The targets: the
pathological batch in at most 2 s, and 0 in each of the last three columns.

    python benchmarks/scoring.py [--data ../shared/data/gsm8k/test.jsonl] [--timeout 1.0]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
PATHOLOGICAL = [
    "Let me think. Answer: 999999999999999999999!",
    "So the value is ((((((((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))))))))",
    "The total is \\boxed{10^{10^{10^{10}}}}",
]


TAILS = ["I hope it is correct.", "Let me check: that makes sense", "We can stop here, since nothing is left to add"]


def completions_for(question_gold: list[tuple[str, str]], per_prompt: int, rng: random.Random, pathological: float,
                    tails: bool = False):
    """``per_prompt`` completions for each (question, gold): a fixed mix of formats; with ``tails``,
    every completion goes on after its answer on the same line ("The answer is 42. I hope ...")."""
    texts, golds, bad = [], [], []
    for _, gold in question_gold:
        g = int(gold)
        for _ in range(per_prompt):
            value = g if rng.random() < 0.4 else g + rng.choice([-10, -1, 1, 2, 7, 100])
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            steps = f"First, {a} + {b} = {a + b}. Then {a} * 2 = {2 * a}."
            text = rng.choice([
                f"{steps} The answer is {value}.",
                f"{steps} So the total is \\boxed{{{value}}}.",
                f"{steps}\n#### {value}",
                f"Let me see... maybe {a}, or {b}? I keep going around in circles here, thinking about {a + b} "
                f"and whether that is right. Probably it is {value}",
                "I am not sure how to solve this problem.",
                f"{steps} The final answer is {value:,}.",
            ])
            if tails:
                text = f"{steps} The answer is {value}. {rng.choice(TAILS)}"
            is_bad = rng.random() < pathological
            texts.append(rng.choice(PATHOLOGICAL) if is_bad else text)
            golds.append(gold)
            bad.append(is_bad)
    return texts, golds, bad


def serial_math_verify(completion: str, gold: str) -> float:
    from math_verify import parse, verify

    return float(verify(parse(gold), parse(completion)))


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def slowest_podsrl(texts: list[str], golds: list[str]) -> float:
    """Each completion alone: the fast path in-process, else one task on the idle pool."""
    from podsrl.rewards import accuracy_reward

    spec = accuracy_reward.per_completion
    worst = 0.0
    for text, gold in zip(texts, golds):
        seconds, value = timed(spec.fast, text, gold)
        if value is None:
            seconds += timed(accuracy_reward, [text], [gold])[0]
        worst = max(worst, seconds)
    return worst


def rule_fires(text: str, gold: str) -> bool:
    """Whether podsrl rejects the completion's answer as implausible before math-verify sees it."""
    from podsrl.rewards.answers import extract_answer, gold_answer, implausible

    answer = extract_answer(text)
    return answer is not None and implausible(answer, gold_answer(gold)) is not None


def run(name: str, texts: list[str], golds: list[str], bad: list[bool]) -> dict:
    from podsrl.rewards import accuracy_reward
    from podsrl.rewards.answers import fast_match

    serial = [timed(serial_math_verify, t, g) for t, g in zip(texts, golds)]
    serial_total = sum(s for s, _ in serial)
    fast_total, ours = timed(accuracy_reward, texts, golds)
    differ = sum(1 for (_, v), o, b in zip(serial, ours, bad) if not b and v != o)
    bad_in_pool = sum(1 for t, g, b in zip(texts, golds, bad) if b and fast_match(t, g) is None)
    rule_on_ok = sum(1 for t, g, b in zip(texts, golds, bad) if not b and rule_fires(t, g))
    row = {
        "batch": name, "completions": len(texts), "pathological": sum(bad),
        "serial_s": serial_total, "podsrl_s": fast_total, "speedup": serial_total / fast_total,
        "serial_slowest_s": max(s for s, _ in serial), "podsrl_slowest_s": slowest_podsrl(texts, golds),
        "differ_non_pathological": differ, "pathological_sent_to_pool": bad_in_pool,
        "rule_fired_on_non_pathological": rule_on_ok,
        "podsrl_correct": sum(ours), "serial_correct": sum(v for _, v in serial),
    }
    print(f"{name:<22} {len(texts):>5} {sum(bad):>5} {serial_total:>10.3f} {fast_total:>10.3f} {row['speedup']:>8.1f}x "
          f"{row['serial_slowest_s']:>10.3f} {row['podsrl_slowest_s']:>10.3f} {differ:>7} {bad_in_pool:>8} "
          f"{rule_on_ok:>7}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="GSM8K test.jsonl (questions and #### answers)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--per-prompt", type=int, default=64)
    parser.add_argument("--pathological", type=float, default=0.01, help="fraction in the second batch")
    parser.add_argument("--timeout", type=float, default=1.0, help="podsrl's bound per completion (reward_timeout_s)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    from podsrl.rewards import accuracy_reward, pool

    rows = [json.loads(l) for l in args.data.read_text().splitlines()[: args.prompts]]
    qa = [(r["question"], r["answer"].rsplit("####", 1)[1].strip().replace(",", "")) for r in rows]
    pool.configure(timeout=args.timeout)
    start, _ = timed(accuracy_reward, ["\\boxed{\\frac{\\sqrt{8}}{2}}"], ["\\sqrt{2}"])  # starts the pool: once per run
    print(f"reward pool: {pool.get_pool().workers} workers, bound {args.timeout} s per completion, started in {start:.2f} s")
    print(f"{'batch':<22} {'n':>5} {'bad':>5} {'serial s':>10} {'podsrl s':>10} {'speed-up':>9} "
          f"{'serial max':>10} {'podsrl max':>10} {'differ':>7} {'bad pool':>8} {'rule ok':>7}")
    results = []
    batches = [("typical", 0.0, 0, False), (f"{args.pathological:.0%} pathological", args.pathological, 1, False),
               ("text after the answer", 0.0, 2, True)]
    for name, fraction, seed, tails in batches:
        texts, golds, bad = completions_for(qa, args.per_prompt, random.Random(seed), fraction, tails)
        results.append(run(name, texts, golds, bad))
    pool.shutdown()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
