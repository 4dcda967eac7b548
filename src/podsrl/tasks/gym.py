"""reasoning-gym's procedural tasks as a podsrl task: ``task.name=gym`` (``pip install -e '.[gym]'``).

reasoning-gym holds 100+ generators of verifiable problems (arithmetic, counting, strings, logic,
games), each with a difficulty config and its own verifier ``score_answer(answer, entry)``, some of
which give partial credit. :func:`gym_task` makes one of them (``task.dataset`` with its settings in
``task.config``), or a weighted mix (``task.datasets``, reasoning-gym's composite), a
:class:`podsrl.tasks.Task`:

1. The held-out set: ``test_size`` problems with distinct questions, from the generator seeded with
   :func:`held_out_seed` (derived from the run's seed).
2. The training stream: endless, the same order for the same seed, from the generator seeded
   :data:`HELD_OUT_SPAN` above it in chunks of :data:`CHUNK` (so no generator seed is shared with
   the held-out draws). A problem whose question is held out is skipped: training never draws a
   held-out question.
3. The overlap: skipping changes what training sees by the share of the generator's draws whose
   question is held out. It is measured on 1,000 to 5,000 further draws (:data:`PROBE`) when the
   task is built, logged, and a held-out set over :data:`MAX_OVERLAP` is refused: the generator's
   settings give too few distinct questions for a held-out set of that size.
4. The reward: each problem carries its entry (:attr:`podsrl.tasks.Problem.entry`), and the
   ``accuracy`` reward calls :func:`score` in the reward pool: the answer :func:`answer_of` finds,
   judged by the data set's own verifier, its value kept (partial credit included, but for the
   credit a verifier gives an answer for holding the gold among other text: a hedge's).
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import itertools
import json
import logging
import math
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from podsrl.errors import PodsError, first_line, install_hint
from podsrl.rewards.answers import ANSWER_MARKER, ANSWER_TAG, Mark, alternative_after, as_number, marked_answer, retracted
from podsrl.rewards.pool import Unscored
from podsrl.tasks import Problem, Task

log = logging.getLogger(__name__)

INSTALL = install_hint("gym")
CHUNK = 10_000
"""Training problems drawn from one generator instance before the next is seeded."""
HELD_OUT_SPAN = 2**24
"""Generator seeds reserved for the held-out draws; training's seeds start this far above them."""
PROBE, PROBE_MAX = 1_000, 5_000
"""The overlap is measured on blocks of PROBE draws after the held-out set's, up to PROBE_MAX while
it lies within a factor 2 of MAX_OVERLAP (near the bound, where one block's count is too few)."""
MAX_OVERLAP = 0.01
"""The largest share of the generator's draws a held-out set may take from training."""
BLOCK = 500
"""Problems the child generates for one request."""
MAX_SKIPPED_IN_A_ROW = 10_000
"""Held-out questions drawn in a row after which the training stream gives up (it never stalls)."""
PODSRL_SETS = ("seed", "size")
"""Generator settings podsrl sets itself, refused in task.config."""

SYSTEM_PROMPT = "Answer the question. Reply with only the final answer."


def require():
    """The reasoning_gym module, or one line naming the install command."""
    try:
        import reasoning_gym
    except ImportError:
        raise PodsError(f"task.name=gym needs reasoning-gym, which is not installed: {INSTALL}") from None
    return reasoning_gym


def dataset_names() -> dict[str, str]:
    """Every reasoning-gym data set, by name, with its category (``arithmetic``, ``logic``, ...)."""
    require()
    from reasoning_gym.factory import DATASETS

    return {name: cls.__module__.split(".")[1] for name, (cls, _) in sorted(DATASETS.items()) if name != "composite"}


def held_out_seed(seed: int) -> int:
    """The held-out generator's seed for a run's ``seed``: spread over [0, 2^29), so that training's
    seeds (:data:`HELD_OUT_SPAN` above) stay below 2^32, which some generators require."""
    return random.Random(f"podsrl-gym-{seed}").getrandbits(29)


# --------------------------------------------------------------------------- settings


def source_problem(dataset: str | None, datasets: list | None) -> str | None:
    """What is wrong with how the data sets are named (both or neither of ``task.dataset`` and
    ``task.datasets``), or None."""
    if bool(dataset) != bool(datasets):
        return None
    return ("task.name=gym needs one of task.dataset (one data set) and task.datasets (a weighted mix); "
            + ("both are set" if dataset else "neither is set"))


def _specs(dataset: str | None, config: dict | None, datasets: list | None) -> list[tuple[str, float, dict]]:
    """(name, weight, settings) of each data set, checked: names known, settings a mapping."""
    if problem := source_problem(dataset, datasets):
        raise PodsError(problem)
    if dataset:
        if dataset == "composite":
            raise PodsError("a mix of data sets is given as task.datasets: [{name: ..., weight: ..., config: {...}}, ...]")
        specs = [(dataset, 1.0, dict(config or {}))]
    else:
        if config:
            raise PodsError("task.config applies to task.dataset; with task.datasets give each its own config")
        specs = [_spec(i, item) for i, item in enumerate(datasets)]
        names = [name for name, _, _ in specs]
        if len(set(names)) < len(names):
            raise PodsError(f"task.datasets names a data set twice: {names}")
    known = dataset_names()
    for name, _, settings in specs:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"closest: {', '.join(close)}; " if close else ""
            raise PodsError(f"unknown reasoning-gym data set {name!r}; {hint}podsrl tasks lists all {len(known)}")
        if set(settings) & set(PODSRL_SETS):
            raise PodsError(f"task.config of {name} sets {sorted(set(settings) & set(PODSRL_SETS))}: podsrl sets "
                            "those (from seed and task.test_size)")
    return specs


def _spec(i: int, item) -> tuple[str, float, dict]:
    where = f"task.datasets[{i}]"
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise PodsError(f"{where} must be a mapping with a name: {{name: chain_sum, weight: 1, config: {{...}}}}")
    if extra := set(item) - {"name", "weight", "config"}:
        raise PodsError(f"{where} has unknown keys {sorted(extra)}; known: name, weight, config")
    weight, settings = item.get("weight", 1.0), item.get("config") or {}
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or not math.isfinite(weight):
        raise PodsError(f"{where}: weight must be a number > 0, got {weight!r}")
    if not isinstance(settings, dict):
        raise PodsError(f"{where}: config must be a mapping, got {settings!r}")
    return item["name"], float(weight), dict(settings)


def _create(name: str, settings: dict, seed: int, size: int):
    """reasoning-gym's ``create_dataset``, its refusal of a setting as one line."""
    from reasoning_gym import create_dataset
    from reasoning_gym.factory import DATASETS

    allowed = [f for f in DATASETS[name][1].__dataclass_fields__ if f not in PODSRL_SETS]
    if unknown := sorted(set(settings) - set(allowed)):
        raise PodsError(f"{name} has no setting {', '.join(unknown)}; its settings: {', '.join(allowed)}")
    try:
        return create_dataset(name, **settings, seed=seed, size=size)
    except Exception as e:  # noqa: BLE001 (whatever its config's checks raise: an assertion, a type error)
        raise PodsError(f"{name} rejects task.config {settings}: {type(e).__name__}: {first_line(e)}") from None


def _generator(specs: list[tuple[str, float, dict]]) -> Callable[[int, int], Any]:
    """``make(seed, size)``: the data set, or reasoning-gym's composite of the weighted data sets,
    made in a child process that gives a seed the same problems in every run (string hashing and
    the global generators fixed: :mod:`podsrl.tasks._gym_worker`)."""
    return lambda seed, size: _Served(specs, seed, size)


class _Served:
    """A generator instance in the child: ``[index]`` as reasoning-gym's, fetched :data:`BLOCK`
    entries at a time (the held-out set and the stream read them in order)."""

    def __init__(self, specs: list[tuple[str, float, dict]], seed: int, size: int):
        self.request, self.size = (specs, seed, size), size
        self.start, self.entries, self.error = 0, [], None

    def __getitem__(self, index: int) -> dict:
        if not self.start <= index < self.start + len(self.entries) and not (
                self.error and index == self.start + len(self.entries)):
            stop = max(index + 1, min(index + BLOCK, self.size))
            self.start = index
            self.entries, self.error = _WORKER.entries(*self.request, index, stop)
        if index - self.start < len(self.entries):
            return self.entries[index - self.start]
        raise RuntimeError(self.error)


class _Worker:
    """The child interpreter (one a process, started when first asked, ended at exit)."""

    def __init__(self):
        self.proc, self.pid, self.lock = None, None, threading.Lock()

    def entries(self, specs, seed: int, size: int, start: int, stop: int) -> tuple[list[dict], str | None]:
        with self.lock:
            if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
                self.start()
            try:
                pickle.dump((specs, seed, size, start, stop), self.proc.stdin)
                self.proc.stdin.flush()
                return pickle.load(self.proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as e:
                self.close()
                raise PodsError(f"reasoning-gym's generator process ended ({type(e).__name__}: {first_line(e)}); "
                                "its stderr above says why") from None

    def start(self) -> None:
        """The child, in a folder of its own: codeio's programs write files where they run."""
        if self.pid is None:
            atexit.register(self.close)
        self.close()
        worker = Path(__file__).with_name("_gym_worker.py")
        self.folder = tempfile.mkdtemp(prefix="podsrl-gym-")
        self.proc = subprocess.Popen([sys.executable, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=self.folder, env={**os.environ, "PYTHONHASHSEED": "0"})
        self.pid = os.getpid()

    def close(self) -> None:
        if self.proc is not None and self.pid == os.getpid():
            with contextlib.suppress(OSError):  # a child that died mid-request: its pipe is broken
                self.proc.stdin.close()  # the child ends at the end of its requests
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.folder, ignore_errors=True)
        self.proc = None


_WORKER = _Worker()


def _draw(dataset, index: int, settings: dict[str, str]) -> Problem:
    """Problem ``index`` of a generator instance, with the entry its verifier needs."""
    try:
        entry = dataset[index]
    except Exception as e:  # noqa: BLE001 (a generator that fails on its own settings)
        raise PodsError(f"reasoning-gym could not generate a problem ({type(e).__name__}: {first_line(e)}); "
                        "check task.config") from None
    name = entry["metadata"]["source_dataset"]
    answer = "" if entry["answer"] is None else str(entry["answer"])  # some verifiers check validity instead
    return Problem(entry["question"], answer, {"dataset": name, "config": settings[name], "entry": entry})


# --------------------------------------------------------------------------- the task


def gym_task(dataset: str | None = None, config: dict | None = None, datasets: list | None = None,
             test_size: int = 200, seed: int = 0, **_) -> Task:
    """A reasoning-gym data set (``dataset``, with generator settings ``config``) or a weighted mix
    (``datasets``: ``[{name, weight, config}, ...]``) as a task; see the module docstring."""
    require()
    specs = _specs(dataset, config, datasets)
    if not 1 <= test_size <= HELD_OUT_SPAN // 4:
        raise PodsError(f"task.name=gym needs task.test_size in 1..{HELD_OUT_SPAN // 4}, got {test_size}")
    settings = {name: json.dumps(s, sort_keys=True) for name, _, s in specs}
    for name, _, s in specs:  # settings checked, and verifiers built once here: forked reward workers inherit them
        _verifier(name, settings[name])
    make = _generator(specs)
    label = specs[0][0] if dataset else "+".join(name for name, _, _ in specs)

    test, overlap, probed = held_out(make, settings, test_size, seed)
    if len(test) < test_size:
        raise PodsError(f"{label}: only {len(test)} distinct questions in {2 * test_size + 100} draws: its settings give "
                        f"too few distinct questions for task.test_size={test_size}; lower it or make task.config harder")
    if overlap > MAX_OVERLAP:
        raise PodsError(f"{label}: the held-out set is {overlap:.1%} of what the generator draws (measured on {probed} "
                        f"draws; at most {MAX_OVERLAP:.0%}): its settings give too few distinct questions for "
                        f"task.test_size={test_size}; lower it or make task.config harder")
    log.info("gym %s: %d held-out problems, %.1f%% of the generator's draws (measured on %d), skipped in training",
             label, len(test), 100 * overlap, probed)
    questions = frozenset(p.question for p in test)

    def train(stream_seed: int) -> Iterator[Problem]:
        skipped = 0
        for problem in generated(make, settings, held_out_seed(stream_seed) + HELD_OUT_SPAN):
            if problem.question not in questions:
                skipped = 0
                yield problem
            elif (skipped := skipped + 1) >= MAX_SKIPPED_IN_A_ROW:
                raise PodsError(f"{label}: {skipped} training problems in a row were held-out questions")

    return Task("gym", train, test, SYSTEM_PROMPT)


def generated(make: Callable[[int, int], Any], settings: dict[str, str], first_seed: int) -> Iterator[Problem]:
    """Every problem of the generator seeded ``first_seed``, then ``first_seed + CHUNK``, ...: the
    training stream before held-out questions are skipped."""
    for chunk in itertools.count():
        dataset = make(first_seed + chunk * CHUNK, CHUNK)
        for index in range(CHUNK):
            yield _draw(dataset, index, settings)


def held_out(make: Callable[[int, int], Any], settings: dict[str, str], test_size: int,
             seed: int) -> tuple[list[Problem], float, int]:
    """``test_size`` problems with distinct questions from the held-out generator (fewer where it
    repeats too often); the share of further draws of it whose question they hold (the overlap),
    and how many draws that was measured on."""
    limit = 2 * test_size + 100  # past it, over a third of the draws repeat a question: refused anyway
    dataset = make(held_out_seed(seed), limit + PROBE_MAX)
    test, questions, index = [], set(), 0
    while len(test) < test_size and index < limit:
        problem = _draw(dataset, index, settings)
        index += 1
        if problem.question not in questions:
            questions.add(problem.question)
            test.append(problem)
    if len(test) < test_size:
        return test, 1.0, 0
    hits = probed = 0
    while probed < PROBE_MAX and (not probed or MAX_OVERLAP / 2 <= hits / probed <= 2 * MAX_OVERLAP):
        start = index + probed
        hits += sum(_draw(dataset, i, settings).question in questions for i in range(start, start + PROBE))
        probed += PROBE
    return test, hits / probed, probed


def overlap(task: Task, draws: int = 10_000, seed: int = 0) -> float:
    """The share of ``task``'s held-out questions among the first ``draws`` problems of its
    training stream (0 for a gym task, which skips them)."""
    held = {p.question for p in task.test}
    seen = {p.question for p in itertools.islice(task.train(seed), draws)}
    return len(held & seen) / max(len(held), 1)


# --------------------------------------------------------------------------- the reward


@lru_cache(maxsize=None)
def _verifier(name: str, settings: str) -> Callable[[str | None, dict], float]:
    """The data set's ``score_answer``, of an instance with the task's settings (a few verifiers
    read them)."""
    return _create(name, json.loads(settings), 0, 1).score_answer


def answer_of(completion: str, gold: str | None) -> str | None:
    """The answer the verifier is given, whole: reasoning-gym's convention where the completion
    uses it (the last ``<answer>...</answer>``, ``reasoning_gym.utils.extract_answer``, unless the
    completion retracts it or offers another answer right after it: then none); else the
    answer it marks (:func:`podsrl.rewards.answers.marked_answer`: ``\\boxed{}``, ``#### N``, an
    answer line, unless the gold itself holds the word "answer"); else the whole reply, which the
    task's prompt asks to be only the answer (several lines stay several lines). Quotes (or
    ``**``) around it, and a final period the gold lacks, are dropped. None: the completion holds
    no answer."""
    from reasoning_gym.utils import extract_answer

    if (tagged := extract_answer(completion)) is not None:
        return None if _withdrawn(completion, tagged) else tagged
    gold = gold or ""
    marked = None if re.search(r"answer", gold, re.IGNORECASE) else marked_answer(completion)
    if marked is not None and "\n" in gold.strip() and (block := _ANSWER_BLOCK.search(completion)):
        marked = block.group(1)  # a gold of several lines: all that follows the last answer line's marker
    answer = _bare(marked if marked is not None else completion, gold)
    return answer or None


def _withdrawn(completion: str, tagged: str) -> bool:
    """Whether the completion negates or retracts its last answer tag (``<answer>[1, 2]</answer>
    is wrong``), or offers another answer right after it (``... </answer> or maybe [3, 4]``), as
    :func:`podsrl.rewards.answers.read` refuses for a marked answer."""
    tags = list(ANSWER_TAG.finditer(completion))  # the tags reasoning-gym reads, the last of them
    if not tags:
        return False
    mark = Mark(tags[-1].start(), tags[-1].end(), tagged, True, True)
    return retracted(completion, mark) or alternative_after(completion, mark)


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def contains_gold(answer: str, gold: str | None) -> bool:
    """Whether ``answer`` holds the gold inside something longer (white space aside): ``[1, 2, 3]
    or [4, 5, 6]``, ``not [1, 2, 3]``, ``3a00`` for ``3a0``. The verifiers' partial credit for such
    an answer (the gold's share of its length) pays a hedge more than committing to one answer: it
    is not paid."""
    gold = _squeezed(gold or "")
    return bool(gold) and gold in _squeezed(answer) and gold != _squeezed(answer)


_ANSWER_BLOCK = re.compile(ANSWER_MARKER + r"((?:(?!\banswer\b).)*)\Z", re.IGNORECASE | re.DOTALL)


def _bare(answer: str, gold: str) -> str:
    """``answer`` without white space around it, one pair of quotes (or ``**``) around it, and a
    final period that ``gold`` does not end with."""
    answer = answer.strip()
    for quote in ('"', "'", "`", "**"):
        if len(answer) > 2 * len(quote) and answer.startswith(quote) and answer.endswith(quote):
            answer = answer[len(quote) : -len(quote)].strip()
            break
    if answer.endswith(".") and not gold.strip().endswith("."):
        answer = answer[:-1].rstrip()
    return answer


def numeric_verdict(answer: str, gold: str | None) -> bool | None:
    """Where the gold is a plain number: whether the whole answer equals it (podsrl's grading,
    :func:`podsrl.rewards.answers.compare`); None where the gold is not a
    number. A data set's verifier gives partial credit where the gold appears inside a longer
    answer, which for a number pays wrong ones (``71`` or ``-7`` for 7); :func:`score` pays its
    value only where this says equal."""
    from podsrl.rewards.answers import compare

    return compare(answer, gold) if gold and as_number(gold.strip()) is not None else None


def score(completion: str, gold: str | None, entry: dict) -> float | Unscored:
    """The data set's verifier on the completion's answer (0.0 where there is none), but for partial
    credit earned by holding the gold inside a longer answer (:func:`contains_gold`). A verifier that
    raises, or returns something other than a finite number, leaves the completion
    :class:`~podsrl.rewards.pool.Unscored` (0, counted in ``reward_timeouts``)."""
    answer = answer_of(completion, gold)
    if answer is None or numeric_verdict(answer, gold) is False:
        return 0.0
    name = entry["dataset"]
    try:
        value = _verifier(name, entry["config"])(answer, entry["entry"])
        value = float(value)
    except Exception as e:  # noqa: BLE001 (the data set's code, on the model's answer)
        return Unscored(f"the verifier of {name} raised {type(e).__name__}: {first_line(e)}")
    if not math.isfinite(value):
        return Unscored(f"the verifier of {name} returned {value}")
    if value < 1 and contains_gold(answer, gold):
        return 0.0  # partial credit for holding the gold among other text: a hedge's
    return value
