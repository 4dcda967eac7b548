"""Which reasoning-gym data sets the embedded model can learn: greedy pass@1 at step 0 on held-out
problems, per data set and setting, with what the extraction and the scoring cost.

    python benchmarks/gym_step0.py [--problems 200] [--only chain_sum,gcd] [--out results.json]
    python benchmarks/gym_step0.py --all --problems 500 --out benchmarks/results/gym_step0/all_defaults.json
    python benchmarks/gym_step0.py --candidates benchmarks/results/gym_step0/all_defaults.json

For each setting (:data:`SETTINGS`: each data set at reasoning-gym's default difficulty and at one
easier setting) it builds the gym task (seed 0), generates one greedy completion per held-out
problem with the embedded model (or ``model.name_or_path=...``), and reports pass@1 (the verifier's
full credit), the mean reward (partial credit included), the same verifier on the raw completion
(no extraction: what a reward that pays the tag format first would give this model), and the time
of scoring the completions through the reward pool and of the verifier alone. One evaluation at a
time; the rows are printed as they finish, as a markdown table at the end. Each row names the
podsrl commit that made it.

``--all``: every data set of reasoning-gym's registry at its default settings, except
:data:`EXCLUDED`, in the registry's (alphabetical) order, each with the completion length of
:func:`token_rule`; the screening of candidates that the rule below reads. A data set that cannot be
built, whose prompts do not fit the model's context, or whose evaluation fails, gets a row with the
reason instead of figures. A rerun with the same ``--out`` goes on after the rows it holds; a data
set during which the process died (killed, out of memory) is tried once more, then recorded as
failed. Stopped with SIGTERM or Ctrl-C, it records that the data set's attempt did not count, and
a rerun evaluates it again as before. ``--shard I/N`` takes every N-th data set from the I-th: N
processes (one per core) fill one ``--out`` together. A process that has done its own data sets
then takes the others' that no live process has started, from the last one back; each data set is
claimed under the file's lock with the claiming process's id, so no two processes evaluate one.

Generation runs in chunks of problems of similar prompt length (:func:`length_chunks`: a chunk pads
only to its own longest prompt), and with ``--out`` each chunk's completions are kept, by prompt,
in ``OUT.partial/`` until the data set's row is written: a rerun after a stop or a death goes on
from the last whole chunk, so a data set longer than one sitting still finishes (committed, the
kept completions carry it to a sitting on another machine).
(Rows made before b066e16 padded every call to the data set's longest prompt; greedy
completions differ between the two ways only by rounding.)

``--candidates FILE``: the screening's candidates from its rows (written next to it as
``candidates.json`` and ``candidates.md``): the data sets whose pass@1 lies in :data:`BAND`
(inclusive); if more than :data:`SCREENED` do, the :data:`SCREENED` closest to :data:`TARGET`, ties
broken by name.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from podsrl import models
from podsrl.checkpoint import write_atomic
from podsrl.config import load_config
from podsrl.errors import PodsError, first_line
from podsrl.evaluate import chat_prompt
from podsrl.rewards import accuracy_reward
from podsrl.rewards.pool import shutdown
from podsrl.rollout import make_engine
from podsrl.rundir import source_commit
from podsrl.tasks import load_task
from podsrl.tasks.gym import _verifier, dataset_names

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


# --all: the screening of every data set at its default settings (fixed before its first run)
EXCLUDED = ("chain_sum", "letter_counting", "count_bits")
"""The gym data sets already used as benchmark candidates (with podsrl's own ``arithmetic`` task)."""
BAND, TARGET, SCREENED = (0.05, 0.50), 0.25, 6
"""Candidates: pass@1 within BAND (inclusive); past SCREENED of them, those closest to TARGET."""
TOKENS_FLOOR, TOKENS_SLACK, TOKENS_CAP = 16, 8, 128
BUILD_LIMIT_S, RAW_LIMIT_S = 3600, 600
"""A data set whose task (held-out set and overlap probe) takes longer to build is recorded as
failed; the verifier on the raw completions (run here, outside the reward pool's bounds) that takes
longer is recorded as None."""
ROW_TOKENS = 32_768
"""Rows x (prompt + completion) tokens per generate call at most (128 rows where prompts are short):
the KV cache of one call stays under ~1.5 GB."""
ATTEMPTS = 2


def token_rule(tokenizer, golds: list[str]) -> int:
    """max_new_tokens for a data set: its longest gold answer (of the held-out problems, in the
    model's tokens) plus TOKENS_SLACK, rounded up to a multiple of 16, within [TOKENS_FLOOR,
    TOKENS_CAP]. Room for the answer the prompt asks for and a few words around it: 16 for
    numbers, as the candidates so far; a gold past TOKENS_CAP - 8 tokens (a grid, a list of moves)
    is cut off at TOKENS_CAP, which such a data set's figure then reflects."""
    longest = max(len(tokenizer(g, add_special_tokens=False).input_ids) for g in golds)
    return min(TOKENS_CAP, max(TOKENS_FLOOR, 16 * math.ceil((longest + TOKENS_SLACK) / 16)))


def raw_verifier_mean(texts: list[str], problems) -> float:
    """The data set's verifier on each completion as generated (no answer extraction)."""
    values = []
    for text, p in zip(texts, problems):
        try:
            values.append(float(_verifier(p.entry["dataset"], p.entry["config"])(text, p.entry["entry"])))
        except Exception:  # noqa: BLE001 (a verifier that raises on raw text scores 0 here)
            values.append(0.0)
    return sum(values) / len(values)


@contextlib.contextmanager
def limited(seconds: int, what: str):
    """PodsError ``{what} took longer than {seconds} s`` where the block does (SIGALRM: Python code)."""
    def late(*_):
        raise PodsError(f"{what} took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def length_chunks(lengths: list[int], tokens: int, most_rows: int) -> list[list[int]]:
    """The problems' indices in generate calls: by prompt length (then index), each call as many
    problems as keep rows x (its longest prompt + ``tokens``) within ROW_TOKENS, and at most
    ``most_rows`` (one at least)."""
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if chunks and len(chunks[-1]) < most_rows and (len(chunks[-1]) + 1) * (lengths[i] + tokens) <= ROW_TOKENS:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def generate_in_chunks(engine, prompts, lengths, tokens, partial: Path | None, key: dict) -> tuple[list[str], float]:
    """One greedy completion per prompt, in :func:`length_chunks`, and the generation's seconds
    (over every sitting). ``partial``: where the completions are kept, by their prompt's SHA-256
    (small enough to commit between sittings on different machines), after each call; those kept
    for the same ``key`` (data set, settings, tokens) are used again for the prompts they answer (a
    data set whose generator is not repeatable, such as codeio's, may build other problems in the
    next sitting), and a call generates the prompts of its chunk that have none. A file of the
    earlier form, keyed by the prompts themselves (``by_prompt``), is read too."""
    kept, seconds, digests = {}, 0.0, [digest(p) for p in prompts]
    if partial is not None and partial.exists():
        saved = json.loads(partial.read_text())
        if saved.get("key") == key:
            kept = saved.get("by_prompt_sha256") or {digest(p): text for p, text in saved.get("by_prompt", {}).items()}
            seconds = saved["seconds"] if kept else 0.0
    default_rows = engine.batch_size
    try:
        for chunk in length_chunks(lengths, tokens, default_rows):
            todo = [i for i in chunk if digests[i] not in kept]
            if not todo:
                continue
            start = time.perf_counter()
            engine.batch_size = len(todo)  # one generate call: padded to this chunk's longest prompt
            texts = engine.generate([prompts[i] for i in todo], 1, 0.0, tokens).texts
            kept.update(zip((digests[i] for i in todo), texts))
            seconds += time.perf_counter() - start
            if partial is not None:
                partial.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(partial, json.dumps({"key": key, "seconds": seconds, "by_prompt_sha256": kept}))
    finally:
        engine.batch_size = default_rows
    return [kept[d] for d in digests], seconds


def digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def partial_path(out: str | None, name: str, config) -> Path | None:
    """Where ``--out``'s data set keeps its completions until its row is written."""
    if out is None:
        return None
    label = config if config == "default" else hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return Path(out + ".partial") / f"{name}-{label}.json"


def evaluate_setting(engine, tokenizer, name, settings, tokens, problems, system_prompt, context=None,
                     partial: Path | None = None) -> dict:
    """One row. ``tokens`` None: :func:`token_rule`. ``context``: the model's context in tokens,
    which every prompt and its completion must fit. ``partial``: see :func:`generate_in_chunks`."""
    start = time.perf_counter()
    with limited(BUILD_LIMIT_S, "building the task"):
        task = load_task("gym", dataset=name, config=settings or {}, test_size=problems, seed=0)
    build_s = time.perf_counter() - start
    tokens = token_rule(tokenizer, [p.answer for p in task.test]) if tokens is None else tokens
    system_prompt = task.system_prompt if system_prompt is None else system_prompt
    prompts = [chat_prompt(tokenizer, system_prompt, p.question) for p in task.test]
    lengths = [len(tokenizer(q, add_special_tokens=False).input_ids) for q in prompts]
    longest = max(lengths)
    if context is not None and longest + tokens > context:
        raise PodsError(f"its longest prompt is {longest} tokens: with {tokens} new ones past the model's context of {context}")
    key = {"dataset": name, "config": settings or "default", "max_new_tokens": tokens}
    texts, generation_s = generate_in_chunks(engine, prompts, lengths, tokens, partial, key)
    start = time.perf_counter()
    rewards = accuracy_reward(texts, [p.answer for p in task.test], [p.entry for p in task.test],  # as evaluation does
                              [p.require_marker for p in task.test], [p.question for p in task.test])
    pool_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        with limited(RAW_LIMIT_S, "the verifier on the raw completions"):
            raw = raw_verifier_mean(texts, task.test)
    except PodsError:
        raw = None
    verifier_s = time.perf_counter() - start
    return {
        "dataset": name, "config": settings or "default", "max_new_tokens": tokens, "problems": len(texts),
        "pass@1": sum(r == 1.0 for r in rewards) / len(rewards), "mean_reward": sum(rewards) / len(rewards),
        "raw_verifier_mean": raw, "longest_prompt_tokens": longest, "build_s": build_s, "generation_s": generation_s,
        "scoring_ms_per_completion": 1000 * pool_s / len(texts), "verifier_ms_per_completion": 1000 * verifier_s / len(texts),
        "examples": [{"question": p.question[-120:], "answer": p.answer, "completion": t} for p, t in zip(task.test[:3], texts)],
    }


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def all_defaults() -> list[tuple[str, None, None]]:
    """Every data set of the registry at its default settings, but EXCLUDED; tokens by the rule."""
    return [(name, None, None) for name in dataset_names() if name not in EXCLUDED]


def candidates(rows: list[dict]) -> dict:
    """The data sets in BAND, and which of them are screened (see the module docstring)."""
    measured = [r for r in rows if "pass@1" in r]
    qualify = sorted((r["dataset"] for r in measured if BAND[0] <= r["pass@1"] <= BAND[1]))
    by_rate = {r["dataset"]: r["pass@1"] for r in measured}
    screened = sorted(qualify, key=lambda d: (abs(by_rate[d] - TARGET), d))[:SCREENED]
    return {"band": BAND, "target": TARGET, "screened_at_most": SCREENED, "excluded": EXCLUDED,
            "measured": len(measured), "failed": {r["dataset"]: r["error"] for r in rows if "error" in r},
            "qualify": qualify, "screened": sorted(screened),
            "rows": [{k: v for k, v in r.items() if k != "examples"} for r in rows]}


def write_candidates(path: Path) -> None:
    """candidates.json and .md from a finished screening: refused in one line while a data set of
    :func:`all_defaults` has no row (the candidates are chosen among all of them, and what
    benchmarks/task_selection.py's gym round reads must not come from part of the screening)."""
    rows = [r for r in json.loads(path.read_text()) if "started" not in r]
    missing = sorted({name for name, _, _ in all_defaults()} - {r["dataset"] for r in rows})
    if missing:
        raise SystemExit(f"gym_step0: the screening in {path} has not finished: {len(missing)} of {len(all_defaults())} "
                         f"data sets have no row yet ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                         "run it again to go on")
    chosen = candidates(rows)
    (path.parent / "candidates.json").write_text(json.dumps(chosen, indent=1) + "\n")
    problems = sorted({r["problems"] for r in rows if "problems" in r})
    lines = [f"Greedy pass@1 at step 0 of the embedded model, {'/'.join(map(str, problems))} held-out problems (seed 0), "
             f"reasoning-gym's default settings ([the protocol](screening.md)): {chosen['measured']} data sets measured, "
             f"{len(chosen['failed'])} could not be; {len(chosen['qualify'])} within {BAND[0]}-{BAND[1]} "
             f"({', '.join(chosen['qualify']) or 'none'}); screened by GRPO's curve: {', '.join(chosen['screened']) or 'none'}.",
             "",
             "| data set | tokens | pass@1 | mean reward | in band | screened | podsrl commit |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["dataset"]):
        if "error" in r:
            lines.append(f"| {r['dataset']} | | failed: {r['error']} | | | | {r['podsrl_commit'][:10]} |")
            continue
        lines.append(f"| {r['dataset']} | {r['max_new_tokens']} | {r['pass@1']:.3f} | {r['mean_reward']:.3f} | "
                     f"{'yes' if r['dataset'] in chosen['qualify'] else 'no'} | "
                     f"{'yes' if r['dataset'] in chosen['screened'] else ''} | {r['podsrl_commit'][:10]} |")
    (path.parent / "candidates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


class Rows:
    """The rows, in ``--out`` (or in memory without one). Each change re-reads the file and replaces
    one data set's row under an exclusive lock, so that several processes (``--shard``) can fill one
    file, each writing only the rows of its own data sets."""

    def __init__(self, path: str | None):
        self.path, self.memory = path, []

    @contextlib.contextmanager
    def _locked(self):
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _load(self) -> list[dict]:
        return json.loads(Path(self.path).read_text()) if os.path.exists(self.path) else []

    def read(self) -> list[dict]:
        if not self.path:
            return list(self.memory)
        with self._locked():
            return self._load()

    @contextlib.contextmanager
    def _editing(self):
        """The rows as a list to change in place; a file's are read and written back whole under
        its lock (written only if changed)."""
        if not self.path:
            yield self.memory
            return
        with self._locked():
            rows = self._load()
            before = list(rows)
            yield rows
            if rows != before:
                write_atomic(Path(self.path), json.dumps(rows, indent=1))

    def claim(self, name: str, config, owner: dict) -> int | None:
        """None if the data set has its row, or a live process other than ``owner`` is evaluating
        it; else its attempts so far (a started row whose process is gone counts as one), and, if
        fewer than ATTEMPTS, the data set is marked started by ``owner``."""
        with self._editing() as rows:
            same = [r for r in rows if r["dataset"] == name and r["config"] == config]
            if any("started" not in r for r in same) or (same and same[0].get("owner") != owner and alive(same[0].get("owner"))):
                return None
            attempts = same[0]["started"] if same else 0
            if attempts < ATTEMPTS:
                rows[:] = [r for r in rows if r not in same] + [{"dataset": name, "config": config,
                                                                 "started": attempts + 1, "owner": owner}]
            return attempts

    def put(self, name: str, config, row: dict | None) -> None:
        """Replace the data set's row by ``row`` (None: remove it)."""
        with self._editing() as rows:
            rows[:] = [r for r in rows if not (r["dataset"] == name and r["config"] == config)] + ([row] if row else [])


def process_id(pid: int | None = None) -> dict | None:
    """A process as the kernel knows it: its pid and start time (``/proc``), so that a pid reused
    by a later process does not pass for the one that claimed a data set."""
    pid = os.getpid() if pid is None else pid
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return {"pid": pid, "start": int(stat.rsplit(")", 1)[1].split()[19])}  # field 22: start time


def alive(owner: dict | None) -> bool:
    return bool(owner) and process_id(owner["pid"]) == owner


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard I/N``: this process takes the I-th of every N data sets (1-based)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"gym_step0: --shard takes I/N (1 <= I <= N), got {text!r}") from None
    if not 1 <= i <= n:
        raise SystemExit(f"gym_step0: --shard takes I/N (1 <= I <= N), got {text!r}")
    return i, n


class Stopped(BaseException):
    """SIGTERM during an evaluation: the screening stopped on purpose, which does not count as the
    data set's process dying (a BaseException, so that no data set's failure handling takes it
    for one)."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated data sets (default: all of SETTINGS)")
    parser.add_argument("--all", action="store_true", help="every data set at its default settings (see above)")
    parser.add_argument("--candidates", default=None, help="write the candidates of this --all file, then stop")
    parser.add_argument("--system-prompt", default=None, help="instead of the gym task's")
    parser.add_argument("--out", default=None, help="write the rows as JSON here (a rerun skips the rows it holds)")
    parser.add_argument("--shard", default="1/1", help="I/N: the I-th of every N data sets, so that N processes "
                        "fill one --out together (default 1/1: all)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.name_or_path=...")
    args = parser.parse_args()
    if args.candidates:
        return write_candidates(Path(args.candidates))
    c = load_config(None, args.overrides)
    torch.manual_seed(0)
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype).eval()
    engine = make_engine("hf", model, tokenizer, c.rollout)
    context = getattr(model.config, "max_position_embeddings", None)
    commit = source_commit()
    signal.signal(signal.SIGTERM, _stop)
    only = set(filter(None, args.only.split(",")))
    shard, shards = parse_shard(args.shard)
    rows = Rows(args.out)

    wanted = [(i, s) for i, s in enumerate(all_defaults() if args.all else SETTINGS) if not only or s[0] in only]
    own = [s for i, s in wanted if i % shards == shard - 1]
    others = [s for i, s in reversed(wanted) if i % shards != shard - 1]  # once its own are done
    me = process_id()
    for name, settings, tokens in own + others:
        config = settings or "default"
        attempts = rows.claim(name, config, me)
        if attempts is None:
            continue
        if attempts >= ATTEMPTS:
            row = {"dataset": name, "config": config,
                   "error": f"the process ended during its evaluation {attempts} times (killed, or out of memory)"}
        else:
            try:
                row = evaluate_setting(engine, tokenizer, name, settings, tokens, args.problems, args.system_prompt, context,
                                       partial_path(args.out, name, config))
            except (Stopped, KeyboardInterrupt) as e:  # on purpose: the attempt is not counted
                rows.put(name, config, {"dataset": name, "config": config, "started": attempts} if attempts else None)
                shutdown()
                print(f"gym_step0: stopped during {name} ({type(e).__name__}); its attempt is not counted, run again to "
                      "go on", file=sys.stderr)
                raise SystemExit(143 if isinstance(e, Stopped) else 130) from None
            except Exception as e:  # noqa: BLE001 (a generator, a verifier or the model failing on this data set)
                row = {"dataset": name, "config": config,
                       "error": first_line(e) if isinstance(e, PodsError) else f"{type(e).__name__}: {first_line(e)}"}
        row["podsrl_commit"] = commit
        rows.put(name, config, row)
        if (partial := partial_path(args.out, name, config)) is not None:
            partial.unlink(missing_ok=True)
        print(json.dumps({k: v for k, v in row.items() if k != "examples"}), flush=True)
    rows = rows.read()
    shutdown()
    print("\n| data set | settings | pass@1 | mean reward | verifier on the raw completion | scoring ms/completion (pool) | verifier ms |")
    print("|---|---|---|---|---|---|---|")
    for r in (r for r in rows if "started" not in r):  # not rows another shard is evaluating
        settings = "default" if r["config"] == "default" else ", ".join(f"{k}={v}" for k, v in r["config"].items())
        if "error" in r:
            print(f"| {r['dataset']} | {settings} | failed: {r['error']} | | | | |")
            continue
        print(f"| {r['dataset']} | {settings} | {r['pass@1']:.3f} | {r['mean_reward']:.3f} | {fmt(r['raw_verifier_mean'])} "
              f"| {r['scoring_ms_per_completion']:.2f} | {r['verifier_ms_per_completion']:.3f} |")


if __name__ == "__main__":
    main()
