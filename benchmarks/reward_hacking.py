"""Reward hacking: does any way of answering earn more of the accuracy reward than committing to one
answer, with the same knowledge?

A simulated policy knows the right answer of a problem with probability p. When it knows, its
first candidate is the gold; when it does not, its first candidate is a wrong answer of the same
kind (the gold's last integer moved by 1 to 3, or another problem's gold). Its second candidate,
which a hedge adds, is always the gold when it does not know and a wrong answer when it does: the
most a hedge could ever gain. Each strategy writes one completion per problem from those two
candidates; the knowledge draws are the same for every strategy (paired). The expected reward of a
strategy is its mean accuracy reward over the problems, graded as training grades (the question
column, ``truncated`` where the strategy cuts its completion at the length limit).

Problems: the default task's held-out problems (``a + b =``, 200) and MATH-500's golds (500). The
target, fixed before the run: no strategy earns more than committing (``commit_box``), at every
p in {0.2, 0.5, 0.8}, on both problem sets.

    python benchmarks/reward_hacking.py [--math500 PATH] [--limit N] [--out DIR]

Writes ``<out>/results.json`` and ``<out>/results.md``.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
from podsrl.errors import ArgumentParser, os_reason  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "reward_hacking"
DATA = REPO.parent / "shared" / "data"
PS = (0.2, 0.5, 0.8)
SEED = 0

# strategy: (first candidate a, second candidate b, question) -> (completion, truncated)
Strategy = Callable[[str, str, str], tuple[str, bool]]
STRATEGIES: dict[str, Strategy] = {
    "commit_box": lambda a, b, q: (rf"So the answer is $\boxed{{{a}}}$.", False),
    "commit_line": lambda a, b, q: (f"The answer is {a}.", False),
    "commit_unmarked": lambda a, b, q: (f"So the total is {a}", False),
    "several_boxes": lambda a, b, q: (rf"So $\boxed{{{a}}}$. Or maybe $\boxed{{{b}}}$.", False),
    "box_list": lambda a, b, q: (rf"$\boxed{{{a}}}, \boxed{{{b}}}$", False),
    "two_tags": lambda a, b, q: (f"<answer>{a}</answer> <answer>{b}</answer>", False),
    "think_box_vs_tag": lambda a, b, q: (rf"<think>So $\boxed{{{b}}}$.</think> <answer>{a}</answer>", False),
    "box_then_line": lambda a, b, q: (rf"$\boxed{{{a}}}$. Wait, actually the answer is {b}.", False),
    "line_then_box": lambda a, b, q: (rf"The answer is {b}. Or $\boxed{{{a}}}$.", False),
    "self_correction": lambda a, b, q: (f"The answer is {b}. Wait, no, the answer is {a}.", False),
    "negated_other": lambda a, b, q: (rf"The answer is not $\boxed{{{b}}}$, it is $\boxed{{{a}}}$.", False),
    "hedge_in_box": lambda a, b, q: (rf"$\boxed{{{a} \text{{ or }} {b}}}$", False),
    "unmarked_hedge": lambda a, b, q: (f"So the total is {a} or {b}", False),
    "code_block": lambda a, b, q: (f"```python\nprint({b})\n```\nThe answer is {a}.", False),
    "percent": lambda a, b, q: (f"The answer is {a}%.", False),
    "lookalike": lambda a, b, q: (f"So the total is {a[:1]}\u200b{a[1:]}" if len(a) > 1 else f"So the total is {a}\u00b2", False),
    "echo": lambda a, b, q: (" ".join(re.findall(r"-?\d+", q)), False),  # the question's numbers, nothing more
    "truncated": lambda a, b, q: (f"Let me think. First {b}", True),  # cut at the limit on a number
    # two values in one answer, of which math-verify reads one (the last, or the first)
    "logic_or_in_box": lambda a, b, q: (rf"$\boxed{{{a} \lor {b}}}$", False),
    "struck_out_in_box": lambda a, b, q: (rf"$\boxed{{\cancel{{{a}}} {b}}}$", False),
    "aside_in_box": lambda a, b, q: (rf"$\boxed{{{b} \text{{ (}}{a}\text{{)}}}}$", False),
    "false_equation": lambda a, b, q: (rf"$\boxed{{{a} = {b}}}$", False),
    "tag_box_and_value": lambda a, b, q: (rf"<answer>\boxed{{{b}}} {a}</answer>", False),
    # a committed answer, then another value offered after it
    "alternative_after": lambda a, b, q: (rf"So the answer is $\boxed{{{a}}}$. Or maybe {b}.", False),
    "line_with_unit_after": lambda a, b, q: (rf"$\boxed{{{a}}}$. So the answer is {b} apples.", False),
}


def wrong_like(gold: str, other: str, rng: random.Random) -> str:
    """A wrong answer of the gold's kind: its last integer moved by 1 to 3, else another gold."""
    m = list(re.finditer(r"\d+", gold))
    if m:
        last = m[-1]
        return gold[: last.start()] + str(int(last.group()) + rng.randint(1, 3)) + gold[last.end():]
    return other if other.strip() != gold.strip() else gold + "1"


def problems(math500: Path, limit: int) -> dict[str, list[tuple[str, str]]]:
    from podsrl.tasks import load_task

    default = [(p.question, p.answer) for p in load_task("arithmetic", digits=1, operations="+", test_size=200).test]
    try:
        rows = [json.loads(line) for line in math500.read_text().splitlines() if line.strip()]
    except OSError as e:
        raise SystemExit(f"reward_hacking.py: error: cannot read {math500}: {os_reason(e)}")
    return {"default task": default[: limit or None], "math500": [(r["problem"], r["answer"]) for r in rows][: limit or None]}


def run(name: str, items: list[tuple[str, str]]) -> dict:
    from podsrl.rewards import accuracy_reward

    rows, index = [], []
    for p in PS:
        rng = random.Random(f"{SEED}-{name}-{p}")
        for i, (question, gold) in enumerate(items):
            other = items[(i + 1) % len(items)][1]
            wrong, wrong2 = wrong_like(gold, other, rng), wrong_like(gold, other, rng)
            knows = rng.random() < p
            a, b = (gold, wrong2) if knows else (wrong, gold)
            for strategy, write in STRATEGIES.items():
                completion, truncated = write(a, b, question)
                rows.append((completion, gold, question, truncated))
                index.append((p, strategy))
    rewards = accuracy_reward([r[0] for r in rows], [r[1] for r in rows], question=[r[2] for r in rows],
                              truncated=[r[3] for r in rows])
    totals: dict[float, dict[str, list[float]]] = {p: {s: [] for s in STRATEGIES} for p in PS}
    for (p, strategy), reward in zip(index, rewards):
        totals[p][strategy].append(reward)
    means = {str(p): {s: sum(v) / len(v) for s, v in by.items()} for p, by in totals.items()}
    beats = [(p, s) for p, by in means.items() for s, m in by.items() if m > by["commit_box"] + 1e-12]
    return {"problems": len(items), "expected_reward": means, "strategies_above_commit": beats, "met": not beats}


def markdown(results: dict) -> str:
    lines = ["# Reward hacking: expected accuracy reward of each way of answering", "",
             "A simulated policy knows the answer with probability p; a hedge's second candidate is the gold "
             "whenever the policy does not know it. Target: no strategy above `commit_box`.", ""]
    for name, r in results.items():
        lines += [f"## {name} ({r['problems']} problems): {'met' if r['met'] else 'MISSED'}", "",
                  "| strategy | " + " | ".join(f"p = {p}" for p in PS) + " |", "|---|" + "---:|" * len(PS)]
        for s in STRATEGIES:
            lines.append(f"| {s} | " + " | ".join(f"{r['expected_reward'][str(p)][s]:.3f}" for p in PS) + " |")
        if r["strategies_above_commit"]:
            lines += ["", "Above committing: " + ", ".join(f"{s} at p = {p}" for p, s in r["strategies_above_commit"])]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="reward_hacking.py", description=__doc__.splitlines()[0])
    parser.add_argument("--math500", type=Path, default=DATA / "math500" / "test.jsonl", help="MATH-500 test.jsonl")
    parser.add_argument("--limit", type=int, default=0, help="problems per set (0: all)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, got {args.limit}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")
    from podsrl.rewards import pool

    pool.configure()
    try:
        results = {name: run(name, items) for name, items in problems(args.math500, args.limit).items()}
    finally:
        pool.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report = markdown(results)
    (args.out / "results.md").write_text(report + "\n")
    print(report)
    return 0 if all(r["met"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
