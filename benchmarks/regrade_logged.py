"""Regrade a comparison's logged held-out answers with the current accuracy reward.

    python benchmarks/regrade_logged.py benchmarks/results/compare_gpu [--max-new-tokens 16]

A run's ``eval_completions.jsonl`` holds the first answers of each evaluation (``log_completions``)
with the verdict of the grader it was trained under (``correct``). This grades each of them again
with :func:`podsrl.rewards.accuracy_reward` and prints, per run, how many verdicts differ, so that
runs trained under different graders can be told apart. Whether an answer was cut at the length
limit is not logged: an answer of ``--max-new-tokens`` tokens or more (the embedded model's
tokenizer) counts as cut, an upper bound on the cut ones, since an answer that ends with EOS at the
limit counts as cut too. No model is run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
from podsrl.errors import ArgumentParser, PodsError, one_line_errors  # noqa: E402


def regrade(run: Path, tokenizer, max_new_tokens: int) -> dict:
    from podsrl.rewards import accuracy_reward
    rows = [json.loads(line) for line in (run / "eval_completions.jsonl").read_text().splitlines() if line.strip()]
    if not rows:
        raise PodsError(f"{run}: no logged answers")
    cut = [len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) >= max_new_tokens for r in rows]
    now = accuracy_reward([r["completion"] for r in rows], [r["answer"] for r in rows],
                          question=[r["question"] for r in rows], truncated=cut)
    then = [bool(r["correct"]) for r in rows]
    return {"answers": len(rows), "paid_then": sum(then), "paid_now": sum(v > 0 for v in now),
            "paid_then_not_now": sum(t and v <= 0 for t, v in zip(then, now)),
            "paid_now_not_then": sum(v > 0 and not t for t, v in zip(then, now)),
            "at_limit": sum(cut)}


@one_line_errors("regrade_logged.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    runs = sorted(p.parent for p in args.folder.glob("*/seed-*/eval_completions.jsonl"))
    if not runs:
        raise PodsError(f"{args.folder}: no <method>/seed-<s>/eval_completions.jsonl")
    from podsrl.models import embedded_model_path, load_tokenizer
    tokenizer = load_tokenizer(embedded_model_path())
    print("| run | logged answers | paid then | paid now | then, not now | now, not then | at the limit |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        r = regrade(run, tokenizer, args.max_new_tokens)
        print(f"| {run.parent.name} {run.name} | {r['answers']} | {r['paid_then']} | {r['paid_now']} | "
              f"{r['paid_then_not_now']} | {r['paid_now_not_then']} | {r['at_limit']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
