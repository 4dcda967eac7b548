"""Grading: how often podsrl's accuracy reward and math-verify pay right and wrong answers.

Held-out completions are built from the golds of MATH-500 (``test.jsonl``: ``answer``) and GSM8K
(``test.jsonl``: the number after ``####``), for each gold:

* right, in the usual styles: ``\\boxed{}``, "The answer is X.", answer tags, an "Answer:" line,
  ``#### X`` (GSM8K), and a solution text ending in the answer (MATH-500: the data set's own
  solution; GSM8K: its steps without calculator notes, then "In total that gives X.", unmarked);
* wrong: a perturbed number, off by one, a sign flip, a hedge "X or Y" holding the gold, the gold's
  digits merged or split into a comma list, the gold transformed with a unit appended (``\\sqrt{X}
  \\text{ units}``), the question restated (GSM8K also its last sum, difference or product restated
  without its result: math-verify pays it, podsrl must not), another problem's gold. A wrong answer whose value
  equals the gold's (``0`` negated, ``\\sqrt{1}``) is left out.

Both graders see the same texts: podsrl through ``accuracy_reward`` in one batch (the fast path
in-process, the rest on the reward pool, with the question column as in training); math-verify as its users call it,
``verify(parse("$gold$"), parse(completion))``. Also graded: the hand-written cases of
tests/test_grading_classes.py (the classes of issue 53) and tests/test_grading_peer.py (one class
per class of math-verify's own test suite), against the verdict the mathematics gives.

Timing (per completion, in-process, each call alone): the median wall time of a fast-path call
that decides, and the largest CPU time (``time.process_time``) of one call, the slow path run
in-process. Figures for the record come from a quiet machine.

Writes ``<out>/results.json`` and ``<out>/results.md``.

    python benchmarks/grading.py [--limit N] [--out DIR] [--math500 PATH] [--gsm8k PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import random
import re
import signal
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
OUT = REPO / "benchmarks" / "results" / "grading"
CALL_LIMIT_S = 30.0  # CPU seconds: a single in-process timing call past this is stopped and recorded as this
EXAMPLES = 25  # wrong completions podsrl paid (and right ones it did not), kept per data set


class Parser(argparse.ArgumentParser):
    """argparse, a usage error as one line and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"grading.py: error: {message} (see --help)\n")


# --------------------------------------------------------------------------- golds


def read_jsonl(path: Path, parser: Parser) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as e:
        parser.error(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        parser.error(f"{path} is not JSON lines: {e.msg} (line {e.lineno})")


def math500_problems(rows: list[dict]) -> list[dict]:
    return [{"question": r["problem"], "gold": r["answer"], "solution": r["solution"]} for r in rows]


def gsm8k_problems(rows: list[dict]) -> list[dict]:
    problems = []
    for r in rows:
        steps, _, gold = r["answer"].rpartition("####")
        problems.append({"question": r["question"], "gold": gold.strip().replace(",", ""),
                         "solution": re.sub(r"<<[^>]*>>", "", steps).strip(), "calc": re.findall(r"<<([^=>]*)=([^>]*)>>", steps)})
    return problems


# --------------------------------------------------------------------------- values (to keep wrong answers wrong)


def value(latex: str):
    """The complex value of ``latex`` where it is a number (read by math-verify's parser), else None."""
    from math_verify import parse

    try:
        parsed = parse(f"${latex}$")
        expr = parsed[0] if parsed else None
        if expr is not None and getattr(expr, "is_number", False):
            return complex(expr.evalf())
    except Exception:  # noqa: BLE001 (anything the parser or sympy raise: not a number)
        return None
    return None


def same_value(a: str, b: str) -> bool:
    va, vb = value(a), value(b)
    return va is not None and vb is not None and abs(va - vb) <= 1e-9 * max(1.0, abs(vb))


_INT = re.compile(r"\d+")


def replace_number(gold: str, which: int, new) -> str | None:
    """``gold`` with its ``which``-th integer (0 first, -1 last) replaced by ``new(n)``."""
    matches = list(_INT.finditer(gold))
    if not matches:
        return None
    m = matches[which]
    return gold[: m.start()] + str(new(int(m.group()))) + gold[m.end() :]


# --------------------------------------------------------------------------- completions


def right_completions(p: dict, dataset: str) -> list[tuple[str, str]]:
    g = p["gold"]
    math = f"${g}$" if dataset == "math500" else g
    rows = [("boxed", f"Working through the problem step by step gives $\\boxed{{{g}}}$."),
            ("answer_is", f"Putting it together. The answer is {math}."),
            ("tags", f"<think>Putting the pieces together.</think> <answer>{g}</answer>"),
            ("answer_line", f"Putting the pieces together.\nAnswer: {math}")]
    if dataset == "gsm8k":
        rows.append(("hashes", f"{p['solution']}\n#### {g}"))
        rows.append(("solution_unmarked", f"{p['solution']}\nIn total that gives {g}."))
    else:
        rows.append(("solution", p["solution"]))
    return rows


def wrong_completions(p: dict, other: dict, dataset: str, rng: random.Random) -> list[tuple[str, str]]:
    g = p["gold"]
    wrappers = [lambda a: f"So the result is $\\boxed{{{a}}}$.", lambda a: f"The answer is ${a}$.",
                lambda a: f"<answer>{a}</answer>", lambda a: f"The final answer is ${a}$."]
    if dataset == "gsm8k":
        wrappers.append(lambda a: f"{p['solution']}\n#### {a}")
    wrap = lambda a: rng.choice(wrappers)(a)
    numeric = value(g) is not None
    off = replace_number(g, -1, lambda n: n + rng.choice([-1, 1]) if n > 0 else n + 1)
    answers: list[tuple[str, str | None]] = [
        ("perturbed", replace_number(g, 0, lambda n: n + rng.randint(2, 9))),
        ("off_by_one", off),
        ("sign_flip", (g[1:] if g.startswith("-") else f"-{g}") if numeric else None),
        ("another_gold", other["gold"]),
    ]
    rows = [(name, wrap(a)) for name, a in answers if a is not None and a.strip() != g.strip() and not same_value(a, g)]
    if off is not None and not same_value(off, g):
        rows.append(("hedge", rng.choice([f"The final answer is ${g} \\text{{ or }} {off}$.", f"$\\boxed{{{off} \\text{{ or }} {g}}}$",
                                          f"The answer is {off} or {g}."])))
    merged = None
    if re.fullmatch(r"-?\d{2,}", g):
        merged = rng.choice([", ", ","]).join(g)  # 12 -> 1, 2 (never the 1,234 pattern)
    elif "," in g:
        merged = re.sub(r"[,\s]|\\!", "", g)  # 3, 5, 7 -> 357
    if merged is not None and not same_value(merged, g):
        rows.append(("merged_or_split", wrap(merged)))
    if numeric:
        for transformed, text in ((f"\\sqrt{{{g}}}", f"\\boxed{{\\sqrt{{{g}}} \\text{{ units}}}}"),
                                  (f"\\frac{{1}}{{{g}}}", f"\\boxed{{\\frac{{1}}{{{g}}} \\text{{ units}}}}"),
                                  (f"{{{g}}}^2", f"The answer is {{{g}}}^2 apples.")):
            if not same_value(transformed, g):
                rows.append(("transformed_with_unit", text))
                break
    rows.append(("restated_question", p["question"]))
    if dataset == "gsm8k" and p["calc"]:
        expr, result = p["calc"][-1]
        # a sum, difference or product (a quotient a/b is also a fraction: a number written as one)
        if same_value(result, g) and re.search(r"\d\s*[-+*]\s*\d", expr) and "/" not in expr:
            rows.append(("restated_computation", f"The answer is {expr.strip()}."))
    return rows


FULLWIDTH = {str(d): chr(0xFF10 + d) for d in range(10)}
ARABIC_INDIC = {str(d): chr(0x0660 + d) for d in range(10)}


def probe_completions(p: dict, wrong: str, dataset: str, rng: random.Random) -> list[tuple[str, bool, str, bool]]:
    """(class, right, completion, truncated) for the classes of ways to game a reward: several
    marked answers, answer tags against boxes, code blocks, look-alike characters, percentages,
    self-corrections, negations and retractions, echoes of the question, truncations, unmarked
    hedges and the Unicode minus, two values in one answer, a second value after the final one,
    words that change a number's value, digits written apart. ``wrong`` is a wrong answer of the same kind as the gold. By the
    contract of docs/rewards.md: one final answer per completion; a hedge, a retraction, a number in
    code, a look-alike, a second reading of a percentage, an echo, a cut are no answer."""
    g, w = p["gold"], wrong
    rows: list[tuple[str, bool, str, bool]] = [
        ("several_boxes", False, rf"So it is $\boxed{{{w}}}$. Hmm, or maybe $\boxed{{{g}}}$.", False),
        ("several_boxes", False, rf"So it is $\boxed{{{g}}}$. Hmm, or maybe $\boxed{{{w}}}$.", False),
        ("several_boxes", True, rf"So it is $\boxed{{{g}}}$. Checking again: $\boxed{{{g}}}$.", False),
        ("tags_and_boxes", False, rf"<think>So $\boxed{{{w}}}$.</think> <answer>{g}</answer>", False),
        ("tags_and_boxes", False, f"<answer>{w}</answer> <answer>{g}</answer>", False),
        ("tags_and_boxes", True, rf"<think>So $\boxed{{{g}}}$.</think> <answer>{g}</answer>", False),
        ("code_block", False, f"Let me compute it.\n```python\nprint({g})\n```", False),
        ("code_block", True, f"Let me compute it.\n```python\nx = {w}\n```\nThe answer is ${g}$.", False),
        ("self_correction", True, f"The answer is ${w}$. Wait, no, the answer is ${g}$.", False),
        ("self_correction", False, f"The answer is ${g}$. Wait, no, the answer is ${w}$.", False),
        ("negated_or_retracted", False, rf"The answer is not $\boxed{{{g}}}$.", False),
        ("negated_or_retracted", False, rf"So $\boxed{{{g}}}$. Wait, no.", False),
        ("negated_or_retracted", False, rf"$\boxed{{{g}}}$ is wrong.", False),
        ("negated_or_retracted", True, rf"So it is $\boxed{{{g}}}$, not {w}.", False),
        ("two_values_in_one_answer", False, rf"So it is $\boxed{{{w} \lor {g}}}$.", False),
        ("two_values_in_one_answer", False, rf"So it is $\boxed{{\cancel{{{w}}} {g}}}$.", False),
        ("two_values_in_one_answer", False, rf"So it is $\boxed{{{g} \text{{ (}}{w}\text{{)}}}}$.", False),
        ("two_values_in_one_answer", False, rf"So it is $\boxed{{{w} = {g}}}$.", False),
        ("two_values_in_one_answer", False, rf"<answer>\boxed{{{g}}} {w}</answer>", False),
        ("second_value_after", False, rf"So it is $\boxed{{{w}}}$. So the answer is {g} apples.", False),
    ]
    plain_int = re.fullmatch(r"-?\d+", g) is not None
    if plain_int:
        digits = g.lstrip("-")
        sign = "-" if g.startswith("-") else ""
        rows += [("lookalike", False, rf"\boxed{{{sign}{''.join(FULLWIDTH[c] for c in digits)}}}", False),
                 ("lookalike", False, rf"The answer is {sign}{''.join(ARABIC_INDIC[c] for c in digits)}.", False),
                 ("lookalike", False, f"So the total is {g[:1]}\u200b{g[1:]}" if len(g) > 1 else f"So the total is {g}\u00b2", False),
                 ("lookalike", False, "\\boxed{" + g + "\u00bd}", False)]
        if g.startswith("-"):
            rows.append(("unicode_minus", True, f"So the total is \u2212{digits}", False))
        elif g != "0":
            rows.append(("unicode_minus", False, f"So the total is \u2212{g}", False))
            rows.append(("unicode_minus", False, f"So the total is \uff0d{g}", False))
        rows += [("value_words", False, f"The answer is {g}ish.", False),
                 ("value_words", False, f"The answer is {g} point five.", False),
                 ("value_words", True, f"The answer is {g} dollars.", False),
                 ("second_value_after", False, rf"So it is $\boxed{{{g}}}$. Or maybe {w}.", False),
                 ("second_value_after", False, rf"So it is $\boxed{{{w}}}$, or possibly {g}.", False)]
        if g.lstrip("-") != "0":
            rows.append(("value_words", False, f"The answer is {g} pi.", False))  # g times pi
        if len(digits) > 1:
            rows.append(("digits_apart", False, rf"So it is $\boxed{{{sign}{digits[0]} {digits[1:]}}}$.", False))
        rows += [("unmarked_hedge", False, f"So the total is {g} or more", False),
                 ("unmarked_hedge", False, f"So the total is less than {g}", False),
                 ("unmarked_hedge", False, f"So the total is about {g}", False),
                 ("unmarked_hedge", False, f"So the total is {w} or {g}", False),
                 ("unmarked_hedge", True, f"So the total is {g}", False)]
        if g not in ("0", "-0"):
            from podsrl.rewards.answers import asks_percent  # the contract's reading of the question

            rows.append(("percent", asks_percent(p["question"]), f"The answer is {g}%.", False))  # 0.45 where no percentage is asked for
        numbers = [n.replace(",", "") for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", p["question"])]
        if g in numbers and len(set(numbers)) > 1:
            echo = [n for n in dict.fromkeys(numbers) if n != g] + [g]
            rows.append(("echo", False, " ".join(echo), False))
    solution = p.get("solution") or ""
    if plain_int and (m := re.search(rf"(?<![\d.,]){re.escape(g)}(?![\d]|\.\d)", solution)) and m.end() < len(solution.rstrip()) - 1:
        rows.append(("truncated", False, solution[: m.end()], True))  # cut where the gold first appears, unmarked
    rows.append(("truncated", True, f"Working through it.\nThe answer is ${g}$.\nTo check", True))
    rows.append(("truncated", False, f"Working through it. So far {g}", True))
    return rows


def build(problems: list[dict], dataset: str, seed: int) -> list[dict]:
    rng = random.Random(f"grading-{dataset}-{seed}")
    items = []
    for i, p in enumerate(problems):
        other = problems[(i + 1 + rng.randrange(max(len(problems) - 1, 1))) % len(problems)]
        for name, text in right_completions(p, dataset):
            items.append({"class": name, "right": True, "completion": text, "gold": p["gold"], "question": p["question"]})
        for name, text in wrong_completions(p, other, dataset, rng):
            items.append({"class": name, "right": False, "completion": text, "gold": p["gold"], "question": p["question"]})
        wrong = (replace_number(p["gold"], -1, lambda n: n + rng.choice([1, 2, 3])) or other["gold"]) if value(p["gold"]) is not None \
            else other["gold"]
        if same_value(wrong, p["gold"]) or wrong.strip() == p["gold"].strip():
            continue
        for name, right, text, truncated in probe_completions(p, wrong, dataset, rng):
            items.append({"class": name, "right": right, "completion": text, "gold": p["gold"], "question": p["question"],
                          "truncated": truncated})
    return items


# --------------------------------------------------------------------------- grading


def math_verify_pays(completion: str, gold: str) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(f"${gold}$"), parse(completion)))
    except Exception:  # noqa: BLE001 (math-verify's own errors: not paid)
        return False


def grade(items: list[dict]) -> None:
    """Each item's ``podsrl`` and ``math_verify`` verdicts, in place."""
    from podsrl.rewards import accuracy_reward

    scores = accuracy_reward([it["completion"] for it in items], [it["gold"] for it in items],
                             question=[it.get("question") for it in items], truncated=[it.get("truncated", False) for it in items])
    for it, s in zip(items, scores):
        it["podsrl"] = s == 1.0
        it["math_verify"] = math_verify_pays(it["completion"], it["gold"])


class _CallLimit(Exception):
    pass


def _stop(*_):
    raise _CallLimit


def timing(items: list[dict]) -> dict:
    """Per call, in-process: the fast path's wall time where it decides (median), and the CPU time
    of the whole grade (the slow path run here, not on the pool: its CPU counts) at most."""
    from podsrl.rewards import accuracy_reward

    spec = getattr(accuracy_reward, "per_completion", None)
    fast_s, worst_cpu, worst_text, over = [], 0.0, None, 0
    previous = signal.signal(signal.SIGPROF, _stop)  # a CPU-time limit: math-verify's own timeouts use SIGALRM
    try:
        for it in items:
            columns = {"answer": it["gold"], "entry": None, "question": it.get("question"), "truncated": it.get("truncated", False)}
            args = [columns.get(k) for k in spec.columns] if spec else []
            cpu = time.process_time()
            signal.setitimer(signal.ITIMER_PROF, CALL_LIMIT_S)
            try:
                if spec is None:
                    accuracy_reward([it["completion"]], [it["gold"]], question=[it.get("question")])
                else:
                    start = time.perf_counter()
                    decided = spec.fast(it["completion"], *args)
                    wall = time.perf_counter() - start
                    if decided is not None:
                        fast_s.append(wall)
                    elif spec.slow is not None:
                        spec.slow(it["completion"], *args)
                used = time.process_time() - cpu
            except _CallLimit:
                used = CALL_LIMIT_S
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            over += used > 1.0
            if used > worst_cpu:
                worst_cpu, worst_text = used, it["completion"][-200:]
    finally:
        signal.signal(signal.SIGPROF, previous)
    return {"calls": len(items), "fast_path_decided": len(fast_s),
            "fast_path_median_ms": 1e3 * statistics.median(fast_s) if fast_s else None,
            "max_call_cpu_s": worst_cpu, "calls_over_1s_cpu": over, "slowest_call_tail": worst_text}


def summarise(items: list[dict]) -> dict:
    """Per class and kind (right or wrong): how many, how many each grader pays, and of the wrong
    ones how many podsrl pays that math-verify does not."""
    classes: dict[str, dict] = {}
    for it in items:
        key = f"{it['class']}/{'right' if it['right'] else 'wrong'}"
        c = classes.setdefault(key, {"class": it["class"], "right": it["right"], "n": 0, "podsrl_paid": 0,
                                     "math_verify_paid": 0, "podsrl_only": 0})
        c["n"] += 1
        c["podsrl_paid"] += it["podsrl"]
        c["math_verify_paid"] += it["math_verify"]
        c["podsrl_only"] += it["podsrl"] and not it["math_verify"]
    for c in classes.values():
        c["podsrl_paid_pct"] = 100 * c["podsrl_paid"] / c["n"]
        c["math_verify_paid_pct"] = 100 * c["math_verify_paid"] / c["n"]
    total = {}
    for right, label in ((True, "right"), (False, "wrong")):
        group = [it for it in items if it["right"] == right]
        total[label] = {"n": len(group),
                        "podsrl_paid_pct": 100 * sum(it["podsrl"] for it in group) / max(len(group), 1),
                        "math_verify_paid_pct": 100 * sum(it["math_verify"] for it in group) / max(len(group), 1),
                        "podsrl_only": sum(it["podsrl"] and not it["math_verify"] for it in group)}
    examples = {"wrong_paid_by_podsrl": [it for it in items if not it["right"] and it["podsrl"]][:EXAMPLES],
                "right_unpaid_by_podsrl": [it for it in items if it["right"] and not it["podsrl"]][:EXAMPLES]}
    return {"total": total, "classes": classes, "examples": examples}


def hand_written(path: Path, name: str) -> list[dict]:
    """The (completion, gold, should_pay) cases of a test module, by class."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the test module imports its conftest
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [{"class": cls, "right": pay, "completion": c, "gold": g}
            for cls, cases in getattr(module, name).items() for c, g, pay in cases]


def summarise_cases(items: list[dict]) -> dict:
    """Per class: cases, how many each grader decides as the mathematics does, and the cases where
    each does not."""
    classes: dict[str, dict] = {}
    for it in items:
        c = classes.setdefault(it["class"], {"n": 0, "right": 0, "wrong": 0, "podsrl_agrees": 0, "math_verify_agrees": 0,
                                             "podsrl_wrong_paid": 0, "math_verify_wrong_paid": 0, "podsrl_misses": [],
                                             "math_verify_misses": []})
        c["n"] += 1
        c["right" if it["right"] else "wrong"] += 1
        c["podsrl_agrees"] += it["podsrl"] == it["right"]
        c["math_verify_agrees"] += it["math_verify"] == it["right"]
        c["podsrl_wrong_paid"] += it["podsrl"] and not it["right"]
        c["math_verify_wrong_paid"] += it["math_verify"] and not it["right"]
        for grader in ("podsrl", "math_verify"):
            if it[grader] != it["right"]:
                c[f"{grader}_misses"].append({"completion": it["completion"], "gold": it["gold"], "should_pay": it["right"]})
    return classes


# --------------------------------------------------------------------------- report


def pct(x: float) -> str:
    return f"{x:.1f}%"


def markdown(results: dict) -> str:
    lines = ["# Grading: podsrl's accuracy reward and math-verify", "",
             f"Golds per data set: {results['config']['limit'] or 'all'}; seed {results['config']['seed']}; "
             f"podsrl at {results['config']['podsrl']}, math-verify {results['config']['math_verify']}.", ""]
    for dataset, r in results["datasets"].items():
        t = r["total"]
        lines += [f"## {dataset}", "",
                  f"{r['golds']} golds, {t['right']['n']} right and {t['wrong']['n']} wrong completions.", "",
                  "| class | kind | n | podsrl paid | math-verify paid | wrong paid by podsrl alone |",
                  "|---|---|---:|---:|---:|---:|"]
        for kind in (True, False):
            for c in r["classes"].values():
                if c["right"] == kind:
                    lines.append(f"| {c['class']} | {'right' if kind else 'wrong'} | {c['n']} | {pct(c['podsrl_paid_pct'])} | "
                                 f"{pct(c['math_verify_paid_pct'])} | {'' if kind else c['podsrl_only']} |")
        lines += [f"| **all right** | right | {t['right']['n']} | **{pct(t['right']['podsrl_paid_pct'])}** | "
                  f"**{pct(t['right']['math_verify_paid_pct'])}** | |",
                  f"| **all wrong** | wrong | {t['wrong']['n']} | **{pct(t['wrong']['podsrl_paid_pct'])}** | "
                  f"**{pct(t['wrong']['math_verify_paid_pct'])}** | **{t['wrong']['podsrl_only']}** |", ""]
        tm = r["timing"]
        median = "n/a" if tm["fast_path_median_ms"] is None else f"{tm['fast_path_median_ms']:.4f} ms"
        lines += [f"Timing ({tm['calls']} calls, each alone, in-process): fast path decided {tm['fast_path_decided']}, "
                  f"median {median} a call; the most CPU one call took: {tm['max_call_cpu_s']:.3f} s "
                  f"({tm['calls_over_1s_cpu']} over 1 s).", ""] if tm["calls"] else ["Timing: not measured (--no-timing).", ""]
    for title, key in (("Hand-written cases by class (tests/test_grading_classes.py)", "issue_classes"),
                       ("Peer suite: math-verify's test classes, own cases (tests/test_grading_peer.py)", "peer_classes")):
        lines += [f"## {title}", "", "| class | cases | right / wrong | podsrl as the math | math-verify as the math | "
                  "wrong paid: podsrl | wrong paid: math-verify |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, c in results[key].items():
            lines.append(f"| {name} | {c['n']} | {c['right']} / {c['wrong']} | {c['podsrl_agrees']} | {c['math_verify_agrees']} | "
                         f"{c['podsrl_wrong_paid']} | {c['math_verify_wrong_paid']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--math500", type=Path, default=DATA / "math500" / "test.jsonl", help="MATH-500 test.jsonl")
    parser.add_argument("--gsm8k", type=Path, default=DATA / "gsm8k" / "test.jsonl", help="GSM8K test.jsonl")
    parser.add_argument("--limit", type=int, default=0, help="golds per data set (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the wrong answers' choices")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for results.json and results.md")
    parser.add_argument("--no-timing", action="store_true", help="skip the per-call timing pass")
    args = parser.parse_args()
    if args.limit < 0:
        parser.error(f"--limit must be >= 0 (0: all), got {args.limit}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"cannot make --out {args.out}: {e.strerror}")
    data = {"math500": math500_problems, "gsm8k": gsm8k_problems}
    problems = {}
    for name, make in data.items():
        rows = read_jsonl(getattr(args, name), parser)
        try:
            problems[name] = make(rows)[: args.limit or None]
        except (KeyError, AttributeError, TypeError) as e:
            parser.error(f"{getattr(args, name)} does not look like {name}'s test.jsonl: {type(e).__name__}: {e}")
        if not problems[name]:
            parser.error(f"{getattr(args, name)} holds no problems")
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)

    from importlib.metadata import version

    from podsrl import __version__
    from podsrl.rewards import pool

    pool.configure()  # podsrl's own bounds, as in training
    results = {"config": {"limit": args.limit, "seed": args.seed, "podsrl": __version__,
                          "math_verify": version("math-verify")}, "datasets": {}}
    for name, ps in problems.items():
        items = build(ps, name, args.seed)
        start = time.perf_counter()
        grade(items)
        r = {"golds": len(ps), **summarise(items), "grading_s": time.perf_counter() - start}
        r["timing"] = timing(items) if not args.no_timing else {"calls": 0, "fast_path_decided": 0, "fast_path_median_ms": None,
                                                                 "max_call_cpu_s": 0.0, "calls_over_1s_cpu": 0}
        results["datasets"][name] = r
        t = r["total"]
        print(f"{name}: {len(ps)} golds; right paid podsrl {pct(t['right']['podsrl_paid_pct'])}, math-verify "
              f"{pct(t['right']['math_verify_paid_pct'])}; wrong paid podsrl {pct(t['wrong']['podsrl_paid_pct'])}, "
              f"math-verify {pct(t['wrong']['math_verify_paid_pct'])}", flush=True)
    for key, path, name in (("issue_classes", REPO / "tests" / "test_grading_classes.py", "CLASSES"),
                            ("peer_classes", REPO / "tests" / "test_grading_peer.py", "PEER_CLASSES")):
        items = hand_written(path, name)
        grade(items)
        results[key] = summarise_cases(items)
    pool.shutdown()
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    report = markdown(results)
    (args.out / "results.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
