"""Prompt tokens an evaluation prefills, padding included: every prompt padded to the longest of
all (as evaluation did until the prompts were sorted), against evaluation's order now (shortest
prompt first) with each generate call padded to its own longest prompt. A count from the tokenizer
alone (no model, no timing), so it holds on any machine and any load; the shared start of the
prompts, prefilled once a call, is counted in both.

    python benchmarks/eval_padding.py [--rows 128] [--out benchmarks/results/evaluation/padding.md]

Tasks: GSM8K's and MATH-500's held-out problems (from ``../shared/data``, or ``--data``), and the
reasoning-gym data sets named by ``--gym`` (500 held-out problems, seed 0, default settings), each
through its own system prompt in the embedded model's chat template; ``--rows`` prompts per call
(the HF engine's default batch on the CPU, one completion a problem).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from podsrl import models
from podsrl.checkpoint import write_atomic
from podsrl.config import load_config
from podsrl.evaluate import chat_prompt
from podsrl.tasks import load_task

REPO = Path(__file__).resolve().parents[1]


def padded(lengths: list[int], rows: int) -> tuple[int, int]:
    """Prompt tokens prefilled with every prompt padded to the longest of all, and with the prompts
    sorted by length and each call of ``rows`` padded to its own longest."""
    ordered = sorted(lengths)
    calls = [ordered[i : i + rows] for i in range(0, len(ordered), rows)]
    return len(lengths) * max(lengths), sum(len(c) * max(c) for c in calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--gym", default="basic_arithmetic,circuit_logic,emoji_mystery,arc_1d")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tokenizer = models.load_tokenizer(load_config(None, []).model.name_or_path)
    tasks = [("gsm8k", load_task("gsm8k", path=f"{args.data}/gsm8k", test_size=500)),
             ("math500", load_task("math500", path=f"{args.data}/math500/test.jsonl", test_size=500))]
    tasks += [(name, load_task("gym", dataset=name, config={}, test_size=500, seed=0)) for name in args.gym.split(",") if name]
    lines = [f"Prompt tokens prefilled by one evaluation of 500 held-out problems, {args.rows} prompts a call "
             "(`python benchmarks/eval_padding.py`):", "",
             "| task | prompt tokens | padded to the longest of all | by length, each call to its own longest | ratio |",
             "|---|---|---|---|---|"]
    for name, task in tasks:
        lengths = [len(tokenizer(chat_prompt(tokenizer, task.system_prompt, p.question), add_special_tokens=False).input_ids)
                   for p in task.test]
        before, after = padded(lengths, args.rows)
        lines.append(f"| {name} | {sum(lengths):,} | {before:,} | {after:,} | {before / after:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        write_atomic(Path(args.out), text)


if __name__ == "__main__":
    main()
