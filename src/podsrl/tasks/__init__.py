"""Tasks: where prompts and gold answers come from.

A task gives a training stream (an endless, seeded sequence of problems: the same order for the
same seed) and a fixed held-out test set. Built in: ``arithmetic`` (generated), ``gsm8k`` and
``math500`` (a local jsonl file or, with a network, a Hugging Face hub name), and ``gym``:
reasoning-gym's generators and verifiers (:mod:`podsrl.tasks.gym`, ``pip install -e '.[gym]'``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from podsrl.errors import PodsError, os_reason


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # gold final answer, compared by podsrl.rewards.answer_matches
    entry: dict | None = field(default=None, hash=False)
    """What the task's own verifier needs (a reasoning-gym entry, :mod:`podsrl.tasks.gym`); None:
    the gold answer is compared by podsrl.rewards.answer_matches. It reaches rewards as ``entry=``."""
    require_marker: bool = False
    """Pay only an answer the completion marks (``\\boxed{}``, answer tags, an answer line,
    ``####``), never an unmarked last number (``task.require_marker``; ``require_marker=``)."""


@dataclass
class Task:
    name: str
    train: Callable[[int], Iterator[Problem]]  # seed -> endless stream
    test: list[Problem]
    system_prompt: str
    trains_on_test: bool = False  # the training problems are the held-out ones (one file, or math500 alone)


ANSWER_IN_TAGS = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process and then provides the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, i.e., <think> reasoning here </think> <answer> answer here </answer>."
)
NUMBER_ONLY = "Solve the arithmetic problem. Reply with only the final number."


def arithmetic(digits: int = 1, operations: str = "+", test_size: int = 200, seed: int = 0, **_) -> Task:
    """Problems ``a op b =`` with operands of up to ``digits`` digits and ``op`` from ``operations``
    (any of ``+-*``). The test set is drawn from a generator seeded apart from the train stream."""
    if digits < 1 or not operations or set(operations) - set("+-*"):
        raise PodsError("arithmetic needs digits >= 1 and operations drawn from '+-*'")
    high = 10**digits - 1

    def draw(rng: random.Random) -> Problem:
        a, op, b = rng.randint(0, high), rng.choice(operations), rng.randint(0, high)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Problem(f"{a} {op} {b} =", str(value))

    def train(stream_seed: int) -> Iterator[Problem]:
        rng = random.Random(f"arithmetic-train-{stream_seed}")
        while True:
            yield draw(rng)

    test_rng = random.Random(f"arithmetic-test-{seed}")
    return Task("arithmetic", train, [draw(test_rng) for _ in range(test_size)], NUMBER_ONLY)


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PodsError(f"{path}:{number}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise PodsError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
    except OSError as e:
        raise PodsError(f"cannot read {path}: {os_reason(e)}") from None
    except UnicodeDecodeError as e:
        raise PodsError(f"cannot read {path}: not UTF-8 text ({e.reason})") from None
    return rows


def _load_rows(source: str, split: str) -> list[dict]:
    """Rows of ``split`` from a jsonl file, a folder holding ``<split>.jsonl``, or a hub name."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / f"{split}.jsonl"
    if path.suffix == ".jsonl" or path.exists() or source.startswith((".", "/", "~")):
        if not path.exists():
            raise PodsError(f"data file not found: {path}")
        rows = _read_jsonl(path)
        where = path
    else:
        rows, where = _load_hub_rows(source, split), f"{source} (split {split})"
    if not rows:
        raise PodsError(f"{where} holds no problems")
    return rows


def _load_hub_rows(name: str, split: str) -> list[dict]:
    """A Hugging Face hub data set, for users with a network (or a cached copy and HF_HUB_OFFLINE=1)."""
    if importlib.util.find_spec("datasets") is None:
        raise PodsError(f"cannot load data set {name!r}: it is not a local file or folder, and hub data sets need "
                        "datasets: pip install datasets")
    from huggingface_hub import constants

    from podsrl import hub

    if not constants.HF_HUB_OFFLINE and not hub.reachable():
        raise PodsError(f"cannot load data set {name!r}: not a local file or folder, and the Hugging Face hub "
                        "cannot be reached (HF_HUB_OFFLINE=1 uses a cached copy)")
    try:
        from datasets import load_dataset

        return list(load_dataset(name, "main" if "gsm8k" in name else None, split=split))
    except Exception as e:  # noqa: BLE001 (any failure to fetch is the user's to fix)
        raise PodsError(f"cannot load data set {name!r} split {split!r}: {e}") from None


def _stream(problems: list[Problem]) -> Callable[[int], Iterator[Problem]]:
    """Endless epochs over ``problems``, each shuffled by (seed, epoch)."""

    def train(seed: int) -> Iterator[Problem]:
        epoch = 0
        while True:
            order = list(range(len(problems)))
            random.Random(f"{seed}-{epoch}").shuffle(order)
            yield from (problems[i] for i in order)
            epoch += 1

    return train


def _fields(rows: list[dict], question: str, answer: str, source: str) -> list[Problem]:
    """Problems from rows: the question must be text; the answer text or a number."""
    for number, row in enumerate(rows, 1):
        if question not in row or answer not in row:
            raise PodsError(f"{source}: problem {number} needs the fields {question!r} and {answer!r}, found {sorted(row)}")
        if not isinstance(row[question], str) or not row[question].strip():
            raise PodsError(f"{source}: problem {number}: {question!r} must be non-empty text, got {_shown(row[question])}")
        if isinstance(row[answer], bool) or not isinstance(row[answer], (str, int, float)):
            raise PodsError(f"{source}: problem {number}: {answer!r} must be text or a number, got {_shown(row[answer])}")
    return [Problem(r[question], str(r[answer])) for r in rows]


def _matchable(problems: list[Problem], source: str) -> list[Problem]:
    """``problems``, each with a gold answer that a completion can match (refused otherwise:
    :func:`podsrl.rewards.answers.unusable_gold`)."""
    from podsrl.rewards.answers import unusable_gold

    for number, problem in enumerate(problems, 1):
        if why := unusable_gold(problem.answer):
            raise PodsError(f"{source}: problem {number}: gold answer {problem.answer!r} cannot be matched ({why})")
    return problems


def _shown(value) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"


def gsm8k(path: str = "openai/gsm8k", test_size: int = 0, **_) -> Task:
    """GSM8K: fields ``question`` and ``answer`` (whose final line is ``#### N``)."""
    gold = lambda a: a.rsplit("####", 1)[-1].strip().replace(",", "")
    train_rows, test_rows = _load_rows(path, "train"), _load_rows(path, "test")
    train = [Problem(p.question, gold(p.answer)) for p in _fields(train_rows, "question", "answer", path)]
    test = [Problem(p.question, gold(p.answer)) for p in _fields(test_rows, "question", "answer", path)]
    train, test = _matchable(train, path), _matchable(test, path)
    one_file = Path(path).expanduser().is_file()  # the train and the test split are its problems
    return Task("gsm8k", _stream(train), _held_out(test, test_size, path), ANSWER_IN_TAGS, trains_on_test=one_file)


def math500(path: str = "HuggingFaceH4/MATH-500", train_path: str | None = None, test_size: int = 0, **_) -> Task:
    """MATH-500 for evaluation (fields ``problem``, ``answer``); it has no training split, so
    training reads ``train_path`` (a MATH-style jsonl) and falls back to the test problems."""
    test = _matchable(_fields(_load_rows(path, "test"), "problem", "answer", path), path)
    train = _matchable(_fields(_load_rows(train_path, "train"), "problem", "answer", train_path), train_path) \
        if train_path else test
    return Task("math500", _stream(train), _held_out(test, test_size, path), ANSWER_IN_TAGS,
                trains_on_test=train_path is None or Path(train_path).expanduser() == Path(path).expanduser())


def _held_out(test: list[Problem], test_size: int, source: str) -> list[Problem]:
    """The first ``test_size`` test problems (0: all); more than there are is refused."""
    if test_size > len(test):
        raise PodsError(f"task.test_size={test_size} but {source} holds {len(test)} test problems; "
                        "give at most that many, or 0 for all")
    return test[: test_size or None]


def _gym(**options) -> Task:
    """A reasoning-gym data set or a weighted mix of them (:func:`podsrl.tasks.gym.gym_task`)."""
    from podsrl.tasks.gym import gym_task

    return gym_task(**options)


TASKS: dict[str, Callable[..., Task]] = {"arithmetic": arithmetic, "gsm8k": gsm8k, "math500": math500, "gym": _gym}
SUMMARIES = {
    "arithmetic": "a op b problems generated from the seed (task.digits, task.operations); nothing to download",
    "gsm8k": "grade-school word problems: a jsonl file, a folder or a hub name (task.path)",
    "math500": "MATH-500: a jsonl file or a hub name (task.path; task.train_path for training problems)",
    "gym": "reasoning-gym's generators and verifiers (task.dataset, task.config, task.datasets)",
}
"""One line per task, as ``podsrl tasks`` lists them."""


def load_task(name: str, **options) -> Task:
    if name not in TASKS:
        raise PodsError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name](**options)


def task_from_config(task, seed: int = 0) -> Task:
    """The task a :class:`podsrl.config.TaskConfig` names."""
    loaded = load_task(task.name, path=task.path, train_path=task.train_path, digits=task.digits,
                       operations=task.operations, test_size=task.test_size, seed=seed, dataset=task.dataset,
                       config=task.config, datasets=task.datasets)
    return requiring_marker(loaded) if task.require_marker else loaded


def requiring_marker(task: Task) -> Task:
    """``task`` with every problem paying only a marked answer (:attr:`Problem.require_marker`)."""
    mark = lambda p: dataclasses.replace(p, require_marker=True)
    train = task.train
    return dataclasses.replace(task, train=lambda seed: map(mark, train(seed)), test=[mark(p) for p in task.test])
