"""How much reward the default run's rollouts get under the grader of this release and under an
earlier one, on the same rollouts: how many are cut at the length limit, and how many each grader pays.

    python benchmarks/default_run_signal.py [--earlier COMMIT] [--problems 32] [overrides ...]
    python benchmarks/default_run_signal.py model.name_or_path=runs/x/checkpoints/step-000016/model

It samples 4 completions of each of the default task's first ``--problems`` held-out problems
(temperature and max_new_tokens as the run's, torch seed 0) and grades each with this checkout's
``fast_match`` (the ``truncated`` column as the trainer computes it) and with the earlier
commit's ``answers.py`` (read from git), printing both counts.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
from podsrl.errors import ArgumentParser  # noqa: E402


def earlier_answers(commit: str):
    """``podsrl.rewards.answers`` as ``commit`` had it (a module of the standard library and
    math-verify alone)."""
    source = subprocess.run(["git", "show", f"{commit}:src/podsrl/rewards/answers.py"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "earlier_answers.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("earlier_answers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="default_run_signal.py", description=__doc__.splitlines()[0])
    parser.add_argument("--earlier", default="d65f42b", help="the commit whose grader is compared (default d65f42b)")
    parser.add_argument("--problems", type=int, default=32, help="held-out problems, 4 samples each (default 32)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the default run's config")
    args = parser.parse_args(argv)
    if args.problems < 1:
        parser.error(f"--problems must be >= 1, got {args.problems}")
    from podsrl import models
    from podsrl.config import load_config
    from podsrl.evaluate import chat_prompt
    from podsrl.rewards.answers import fast_match
    from podsrl.rollout import cut_rows, make_engine
    from podsrl.tasks import task_from_config

    old = earlier_answers(args.earlier)
    c = load_config(None, args.overrides)
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    engine = make_engine("hf", models.load_model(c.model.name_or_path, c.model.dtype), tokenizer, c.rollout)
    task = task_from_config(c.task, seed=c.seed)
    problems = task.test[: args.problems]
    torch.manual_seed(0)
    out = engine.generate([chat_prompt(tokenizer, task.system_prompt, p.question) for p in problems], 4,
                          c.rollout.temperature, c.rollout.max_new_tokens)
    cut = cut_rows(out, c.rollout.max_new_tokens, engine.eos_ids)
    golds = [p for p in problems for _ in range(4)]
    now = sum(fast_match(t, p.answer, False, p.question, x) is True for t, p, x in zip(out.texts, golds, cut))
    before = sum(old.fast_match(t, p.answer, False, p.question) is True for t, p in zip(out.texts, golds))
    print(f"{len(cut)} rollouts, {sum(cut)} cut at {c.rollout.max_new_tokens} tokens; paid: {now} by this grader, "
          f"{before} by {args.earlier}'s (fast path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
