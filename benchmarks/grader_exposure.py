"""Grader exposure: how many held-out problems of each experiment the earlier grader could have paid
for a wrong answer.

    python benchmarks/grader_exposure.py [--out benchmarks/results/grader_exposure] [--pages compare-2digit,...]

The accuracy reward was rewritten to compare the marked answer whole (docs/rewards.md). The grader
of every committed experiment, the one at commit 5d056c0 (``src/podsrl/rewards/answers.py`` and
``src/podsrl/tasks/gym.py``), read a number out of the answer. This rebuilds each experiment's
held-out sets as its runs did (``task_from_config`` with the task settings and seed of each
committed run's ``config.yaml``, or of the benchmark's own settings where no run folder was kept),
loads that grader from git, and counts, per set and seed, the problems on which it paid at least one
wrong answer of these classes:

* **restated question** (every task): the question itself as the completion, and the question
  without its final `` =`` (``0 + 5 =`` and ``0 + 5`` for 5): paid where its last number is the gold;
* **number holding the gold** (reasoning-gym tasks whose gold is a number): ``-G``, ``G1``, ``1G``,
  which the data set's verifier gives partial credit to where the gold appears inside the answer;
* **GSM8K answers** (the scoring benchmark's questions): a hedge ``H or G``, the gold's digits as a
  list (``\\boxed{1, 8}`` for 18), and a unit after a transformed number (``\\sqrt{G}``,
  ``\\frac{1}{G}``, ``10^{G}``), each of which the earlier grader read as its last number.

Every wrong answer is also scored by the current grader (``podsrl.rewards.accuracy_reward``), which
must pay none of them. No model, no generation: the counts are a property of the held-out sets and
the graders. Writes ``exposure.md`` and ``exposure.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OLD_COMMIT = "5d056c0"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"  # benchmarks/scoring.py's default

@dataclass(frozen=True)
class Source:
    """Where an experiment's held-out sets come from: committed run folders (each run's
    ``config.yaml`` gives the task and the seed), or the benchmark's own task settings and seeds."""

    label: str
    runs: str | None = None  # a folder under benchmarks/results holding run folders
    task: dict | None = None
    seeds: tuple[int, ...] = (0,)
    gsm8k_questions: int = 0  # the first N GSM8K test questions instead of a task


PAGES: dict[str, tuple[str, list[Source]]] = {
    "compare-2digit": ("PODS against GRPO and GRPO-GA on two-digit arithmetic", [
        Source("comparison (a)", runs="evidence_a_arithmetic_2digit"),
        Source("comparison (b)", runs="evidence_b_arithmetic_2digit")]),
    "compare-arithmetic": ("CPU comparison", [Source("runs", runs="compare_arithmetic")]),
    "compare-gpu": ("GPU comparison (void)", [Source("runs", runs="compare_gpu")]),
    "gpu-suite": ("GPU suite, step a (configs/compare_gpu.yaml)", [Source("runs", runs="compare_gpu")]),
    "task-selection": ("Choosing the benchmark task", [
        Source("runs", runs="task_selection"),
        Source("step-0 screen, two-digit arithmetic",
               task={"name": "arithmetic", "digits": 2, "operations": "+-", "test_size": 200}),
        Source("step-0 screen, letter_counting",
               task={"name": "gym", "dataset": "letter_counting", "config": {"min_words": 3, "max_words": 5},
                     "test_size": 200}),
        Source("step-0 screen, chain_sum", task={"name": "gym", "dataset": "chain_sum", "test_size": 200})]),
    "adaptive-allocation": ("Adaptive allocation", [Source("runs", runs="adaptive_allocation")]),
    "n-m-sweep": ("n and m", [Source("runs", runs="n_m_sweep")]),
    "rule-ablation": ("Down-sampling rules", [Source("runs", runs="rule_ablation")]),
    "trl-pods": ("TRL GRPOTrainer vs PODSTrainer (benchmarks/trl_pods.py's defaults)", [
        Source("held-out", task={"name": "arithmetic", "digits": 1, "operations": "+-*", "test_size": 200})]),
    "evaluation": ("Evaluation speed (configs/arithmetic_2digit.yaml)", [
        Source("held-out", task={"name": "arithmetic", "digits": 2, "operations": "+-", "test_size": 500})]),
    "scoring": ("Scoring", [
        Source("default run (make train)", runs="default_run/make-train"),
        Source("GSM8K questions of the benchmark", gsm8k_questions=16)]),
    "default-run": ("The default run (Getting started; not an experiment page)", [
        Source("runs", runs="default_run")]),
}
"""Experiment pages (docs/experiments/<page>.md) that report held-out accuracy, and their sets."""

CLASSES = {
    "restated": "restated question",
    "holds_gold": "number holding the gold",
    "hedge": "hedge `H or G`",
    "list": "digits as a list",
    "unit": "unit after a transformed number",
}


# --------------------------------------------------------------------------- the two graders


def _module_at(commit: str, path: str, name: str, replacing: dict[str, ModuleType] | None = None) -> ModuleType:
    """``path`` as it was at ``commit``, imported as module ``name``; while it runs, ``replacing``
    stands in for the modules it imports under those names."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"grader_exposure: error: cannot read {path} at commit {commit} from git: "
                         f"{getattr(e, 'stderr', '') or e}".strip())
    file = Path(tempfile.mkdtemp(prefix="grader-exposure-")) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    saved = {key: sys.modules.get(key) for key in replacing or {}}
    sys.modules.update(replacing or {})
    try:
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module


class OldGrader:
    """The accuracy reward of commit 5d056c0, in-process: ``fast_match``, then ``verify_answer``
    (its reward pool's slow path); a reasoning-gym problem goes to that commit's ``gym.score``
    (its ``answer_of``: the last number of the answer where the gold is a number)."""

    def __init__(self, commit: str = OLD_COMMIT):
        import podsrl.rewards  # noqa: F401 (the current package first, so that it binds the current answers)
        import podsrl.tasks  # noqa: F401

        self.answers = _module_at(commit, "src/podsrl/rewards/answers.py", "podsrl_old_answers")
        self.gym = _module_at(commit, "src/podsrl/tasks/gym.py", "podsrl_old_gym",
                              {"podsrl.rewards.answers": self.answers})

    def reward(self, completion: str, gold: str, entry: dict | None) -> float:
        if entry is not None:
            value = self.gym.score(completion, gold, entry)
            return value if isinstance(value, float) else 0.0  # Unscored counts 0
        decided = self.answers.fast_match(completion, gold)
        return float(decided if decided is not None else self.answers.verify_answer(completion, gold))


def new_rewards(completions: list[str], golds: list[str], entries: list[dict | None]) -> list[float]:
    """The current accuracy reward, as training and evaluation call it."""
    from podsrl.rewards import accuracy_reward

    return accuracy_reward(completions, golds, entries)


# --------------------------------------------------------------------------- wrong answers


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None


def restatements(question: str) -> list[str]:
    """The question as the completion, and without its final `` =``. They state no result, so they
    are wrong whatever the gold."""
    bare = question.rstrip().removesuffix("=").rstrip()
    return [question, bare] if bare != question else [question]


def holding_gold(gold: str) -> list[str]:
    """Numbers other than the gold that hold its text: ``-G``, ``G1``, ``1G`` (``-1..`` for a
    negative gold)."""
    value = _number(gold)
    if value is None:
        return []
    g = gold.strip()
    negated = g[1:] if g.startswith("-") else f"-{g}"
    prefixed = f"-1{g[1:]}" if g.startswith("-") else f"1{g}"
    return [w for w in (negated, f"{g}1", prefixed) if _number(w) is not None and _number(w) != value]


def gsm8k_wrong(gold: str) -> dict[str, list[str]]:
    """Wrong answers of the GSM8K classes for a number gold ``G``: a hedge with a wrong number
    first, the gold's digits written as a list, and a unit after a transformed number (each
    transform left out where it equals the gold: sqrt of 0 or 1, 1/G of 1)."""
    value = _number(gold)
    if value is None:
        return {}
    g = gold.strip()
    other = str(value + 1) if value.denominator == 1 else f"{g}1"
    digits = g.lstrip("-")
    wrong = {
        "hedge": [f"The final answer is ${other} \\text{{ or }} {g}$.", f"\\boxed{{{other} \\text{{ or }} {g}}}"],
        "list": [f"\\boxed{{{g[: len(g) - len(digits) + 1]}, {digits[1:]}}}"] if digits[1:].isdigit() else [],
        "unit": [],
    }
    if value >= 0 and value not in (0, 1):
        wrong["unit"].append(f"\\boxed{{\\sqrt{{{g}}} \\text{{ units}}}}")
    if value not in (0, 1, -1):
        wrong["unit"].append(f"\\boxed{{\\frac{{1}}{{{g}}} \\text{{ units}}}}")
    wrong["unit"].append(f"The answer is $10^{{{g}}}$ apples.")
    return wrong


# --------------------------------------------------------------------------- held-out sets


def _task_key(task: dict) -> dict:
    """The settings that decide a held-out set (defaults of TaskConfig dropped)."""
    from podsrl.config import TaskConfig

    defaults = asdict(TaskConfig())
    keep = ("name", "path", "train_path", "digits", "operations", "dataset", "config", "datasets", "test_size")
    return {k: task[k] for k in keep if k in task and (k in ("name", "test_size") or task[k] != defaults[k])}


def sets_of(source: Source) -> list[tuple[dict, list[int]]]:
    """(task settings, seeds) of a source: for run folders, grouped from their ``config.yaml``."""
    if source.runs is None:
        return [(source.task, list(source.seeds))]
    folder = RESULTS / source.runs
    found: dict[str, tuple[dict, set[int]]] = {}
    for config in sorted(folder.rglob("config.yaml")):
        c = yaml.safe_load(config.read_text())
        key = _task_key(c["task"])
        found.setdefault(json.dumps(key, sort_keys=True), (key, set()))[1].add(int(c.get("seed", 0)))
    if not found:
        raise SystemExit(f"grader_exposure: error: no run's config.yaml under {folder}")
    return [(task, sorted(seeds)) for task, seeds in found.values()]


def held_out(task: dict, seed: int):
    from podsrl.config import TaskConfig
    from podsrl.tasks import task_from_config

    return task_from_config(TaskConfig(**task), seed).test


def describe(task: dict) -> str:
    if task["name"] == "arithmetic":
        return f"arithmetic, {task.get('digits', 1)} digit(s), '{task.get('operations', '+')}'"
    if task["name"] == "gym":
        settings = task.get("config") or {}
        return f"gym {task.get('dataset')}" + (f" {json.dumps(settings)}" if settings else "")
    return task["name"]


# --------------------------------------------------------------------------- counting


def exposure(problems, grader: OldGrader, gsm8k: bool = False) -> dict:
    """Per class: problems with at least one wrong answer the old grader paid (reward > 0) and
    counted as solved (reward 1, what held-out accuracy counts), and those the current grader pays
    (must be 0); one example of each class that was paid."""
    rows = []  # (problem index, class, completion)
    for i, p in enumerate(problems):
        if gsm8k:
            for cls, wrongs in gsm8k_wrong(p.answer).items():
                rows += [(i, cls, w) for w in wrongs]
            continue
        rows += [(i, "restated", w) for w in restatements(p.question)]
        if p.entry is not None:
            rows += [(i, "holds_gold", w) for w in holding_gold(p.answer)]
    old = [grader.reward(w, problems[i].answer, problems[i].entry) for i, _, w in rows]
    new = new_rewards([w for _, _, w in rows], [problems[i].answer for i, _, _ in rows],
                      [problems[i].entry for i, _, _ in rows])
    classes = sorted({cls for _, cls, _ in rows}, key=list(CLASSES).index)
    out = {"problems": len(problems), "classes": {}}
    for cls in classes + ["any"]:
        mine = [(i, w, o, n) for (i, c, w), o, n in zip(rows, old, new) if cls in (c, "any")]
        paid = sorted({i for i, _, o, _ in mine if o > 0})
        example = next(({"question": problems[i].question[-100:], "gold": problems[i].answer, "completion": w,
                         "old_reward": o} for i, w, o, _ in mine if o > 0), None)
        out["classes"][cls] = {
            "old_paid": len(paid),
            "old_solved": len({i for i, _, o, _ in mine if o == 1.0}),
            "new_paid": len({i for i, _, _, n in mine if n > 0}),
            "wrong_answers": len(mine),
            "example": example,
        }
    return out


def run(pages: list[str], gsm8k_path: Path) -> dict:
    grader = OldGrader()
    cache: dict[str, dict] = {}
    report = {"old_grader": OLD_COMMIT, "classes": CLASSES, "pages": {}}
    for page in pages:
        title, sources = PAGES[page]
        entry = {"title": title, "sets": []}
        for source in sources:
            if source.gsm8k_questions:
                from podsrl.tasks import load_task

                key = f"gsm8k:{gsm8k_path}:{source.gsm8k_questions}"
                if key not in cache:
                    problems = load_task("gsm8k", path=str(gsm8k_path)).test[: source.gsm8k_questions]
                    cache[key] = exposure(problems, grader, gsm8k=True)
                entry["sets"].append({"label": source.label, "task": {"name": "gsm8k", "questions": source.gsm8k_questions},
                                      "describe": f"GSM8K test, first {source.gsm8k_questions}",
                                      "seeds": {"-": cache[key]}})
                continue
            for task, seeds in sets_of(source):
                per_seed = {}
                for seed in seeds:
                    key = json.dumps([task, seed], sort_keys=True)
                    if key not in cache:
                        print(f"{page}: {describe(task)}, {task['test_size']} held-out, seed {seed}",
                              file=sys.stderr, flush=True)
                        cache[key] = exposure(held_out(task, seed), grader)
                    per_seed[str(seed)] = cache[key]
                entry["sets"].append({"label": source.label, "task": task, "describe": describe(task), "seeds": per_seed})
        report["pages"][page] = entry
    return report


# --------------------------------------------------------------------------- output


def _pct(k: int, n: int) -> str:
    return f"{k} ({100 * k / n:.1f}%)" if n else "0"


def markdown(report: dict) -> str:
    lines = [
        "# Grader exposure: held-out problems the earlier grader could have paid for a wrong answer",
        "",
        f"`python benchmarks/grader_exposure.py`. The grader of commit {report['old_grader']} (every committed "
        "experiment's) against the current one, on each experiment's held-out sets rebuilt from its runs' "
        "settings. A problem counts in a class where the earlier grader paid at least one wrong answer of "
        "that class (reward > 0; in brackets: reward 1, what held-out accuracy counts). "
        "Classes: restated question (the question, and the question without ` =`, as the completion); "
        "number holding the gold (`-G`, `G1`, `1G`, reasoning-gym number golds); GSM8K: hedge `H or G`, the "
        "gold's digits as a list, a unit after a transformed number. The last column: problems on which the "
        "current grader pays any of these wrong answers.",
        "",
    ]
    for page, entry in report["pages"].items():
        link = "docs/getting-started.md" if page == "default-run" else f"docs/experiments/{page}.md"
        lines += [f"## {entry['title']} (`{link}`)", "",
                  "| set | task | held-out | seed | class | paid by the earlier grader (solved) | paid now |",
                  "|---|---|---|---|---|---|---|"]
        for s in entry["sets"]:
            for seed, e in s["seeds"].items():
                for cls, c in e["classes"].items():
                    if cls == "any" and len(e["classes"]) == 2:
                        continue  # one class: "any" repeats it
                    name = "any of them" if cls == "any" else report["classes"][cls]
                    lines.append(f"| {s['label']} | {s['describe']} | {e['problems']} | {seed} | {name} | "
                                 f"{_pct(c['old_paid'], e['problems'])} ({c['old_solved']}) | {c['new_paid']} |")
        lines.append("")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"grader_exposure: error: {message}\n")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "grader_exposure",
                        help="folder for exposure.md and exposure.json")
    parser.add_argument("--pages", default=",".join(PAGES), help=f"comma-separated, among: {', '.join(PAGES)}")
    parser.add_argument("--gsm8k", type=Path, default=GSM8K,
                        help="GSM8K test.jsonl (the scoring benchmark's questions)")
    args = parser.parse_args(argv)
    pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    if not pages or any(p not in PAGES for p in pages):
        parser.error(f"--pages takes names among {', '.join(PAGES)}, got {args.pages!r}")
    if "scoring" in pages and not args.gsm8k.is_file():
        parser.error(f"--gsm8k: no such file: {args.gsm8k}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {args.out} exists and is not a folder")
    from podsrl.errors import PodsError, first_line

    try:
        report = run(pages, args.gsm8k)
    except PodsError as e:
        parser.exit(2, f"grader_exposure: error: {first_line(e)}\n")
    text = markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exposure.json").write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    (args.out / "exposure.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
