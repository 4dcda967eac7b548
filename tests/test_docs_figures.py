"""The figures that README.md and the site's home page (docs/index.md) quote equal the committed
results they come from (benchmarks/results/), so that a rerun or a rewording cannot leave them
behind. Reads files only: no model, no run.

Every interval quoted in those two pages, with the figure just before it ("0.40× [0.33–0.78]",
"2.35× sooner on the training CPU clock [1.34–5.48]"), must be one of the figures with intervals
in the committed summaries and reports, to two decimals; and the headline figures must be quoted
at all, each read from the result it comes from.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md"]
# the result folders whose figures the two pages quote
FOLDERS = ["evidence_confirm_a_arithmetic_2digit", "evidence_confirm_b_arithmetic_2digit",
           "evidence_confirm_b8_arithmetic_2digit",
           "evidence_a_arithmetic_2digit", "evidence_b_arithmetic_2digit", "compare_arithmetic",
           "evidence_confirm_c_arithmetic_2digit", "compare_gpu", "evidence_confirm_gym_list_functions"]
INTERVAL = re.compile(r"\[(?:95% CI )?([+−-]?\d+\.\d\d)–([+−-]?\d+\.\d\d|∞)\]")
FIGURE = re.compile(r"([+−-]?\d+\.\d\d)")


def _number(x: float | None) -> str:
    return "∞" if x is None else f"{x:.2f}"


def _summary(folder: str, name: str = "summary.json") -> dict:
    return json.loads((RESULTS / folder / name).read_text())


def committed_intervals() -> set[tuple[str, str, str]]:
    """(figure, low, high), as two-decimal strings, of every figure with a 95% interval in the
    committed summaries (summary.json, and summary_vs_<method>.json against another reference:
    each key ``x`` with an ``x_ci95``) and reports (report.md) of FOLDERS."""
    found = set()
    for folder in FOLDERS:
        summaries = [_summary(folder, f.name) for f in sorted((RESULTS / folder).glob("summary*.json"))]
        for method in (m for summary in summaries for m in summary["methods"].values()):
            for key, interval in method.items():
                value = method.get(key.removesuffix("_ci95"))
                if key.endswith("_ci95") and interval and isinstance(value, (int, float)):
                    found.add((_number(value), _number(interval[0]), _number(interval[1])))
        report = RESULTS / folder / "report.md"
        if report.exists():
            text = report.read_text().replace("inf]", "∞]")
            for m in re.finditer(r"([+-]?\d+\.\d\d),? (?:[+-]?\d+\.\d\d )?\[([+-]?\d+\.\d\d)–([+-]?\d+\.\d\d|∞)\]", text):
                found.add(m.groups())
    return found


def quoted_intervals(text: str) -> list[tuple[str, str, str, str]]:
    """(figure, low, high, the quoted text) of each interval in ``text``, the figure being the
    last number within 60 characters before it (bold and "95% CI" aside)."""
    text = text.replace("**", "")
    quoted = []
    for m in INTERVAL.finditer(text):
        before = FIGURE.findall(text[max(0, m.start() - 60):m.start()])
        if before:
            figure, low, high = (x.replace("−", "-") for x in (before[-1], *m.groups()))
            quoted.append((figure, low, high, text[max(0, m.start() - 60):m.end()].split("\n")[-1]))
    return quoted


def unsupported(text: str, committed: set[tuple[str, str, str]]) -> list[str]:
    """The quoted intervals of ``text`` that no committed result holds."""
    return [q for figure, low, high, q in quoted_intervals(text) if (figure, low, high) not in committed]


def headline() -> dict[str, tuple[str, ...]]:
    """The figures both pages must quote, each read from the result it comes from: (figure, low,
    high) as two-decimal strings, or (figure,) where the page gives no interval."""
    a = _summary("evidence_confirm_a_arithmetic_2digit")["methods"]["pods"]
    b = _summary("evidence_confirm_b_arithmetic_2digit")["methods"]["pods"]
    b8 = _summary("evidence_confirm_b8_arithmetic_2digit")["methods"]["pods"]
    first_a = _summary("evidence_a_arithmetic_2digit")["methods"]["pods"]
    first_b = _summary("evidence_b_arithmetic_2digit")["methods"]["pods"]
    rule = re.search(r"max-variance / random, optimizer steps to 90% of grpo's gain: (\d\.\d\d) \[(\d\.\d\d)–(\d\.\d\d)\]",
                     (RESULTS / "evidence_confirm_a_arithmetic_2digit" / "report.md").read_text())
    confirm_c = _summary("evidence_confirm_c_arithmetic_2digit")["methods"]["pods-async"]
    list_functions = _summary("evidence_confirm_gym_list_functions")["methods"]["pods"]
    gpu = _summary("compare_gpu")["methods"]["pods"]
    gpu_vs_ga = _summary("compare_gpu", "summary_vs_grpo-ga.json")["methods"]["pods"]
    memory = re.search(r"update memory ratio grpo / pods: (\d+\.\d\d)x", (RESULTS / "memory_gpu.txt").read_text())

    def ci(method: dict, key: str) -> tuple[str, str, str]:
        return (_number(method[key]), *map(_number, method[f"{key}_ci95"]))

    return {
        "confirmation (a): PODS's steps to 90% of GRPO's gain": ci(a, "step_ratio_to_gain"),
        "confirmation (a): max-variance's steps over random's": rule.groups(),
        "confirmation (a): CPU-clock speed-up over GRPO": ci(a, "speedup_to_gain"),
        "confirmation (b): CPU-clock speed-up over GRPO-GA": ci(b, "speedup_to_gain"),
        "confirmation (b) on eight seeds: CPU-clock speed-up over GRPO-GA": ci(b8, "speedup_to_gain"),
        "first runs (a): steps to GRPO's peak": ci(first_a, "step_ratio_vs_reference"),
        "first runs (b): CPU clock to GRPO-GA's peak": ci(first_b, "speedup_vs_reference"),
        "update memory, GRPO (all n) over PODS": (memory[1],),
        "confirmation (c): PODS at the lag, wall-clock speed-up over GRPO": ci(confirm_c, "speedup_to_gain"),
        "list_functions: PODS's steps to 90% of GRPO's gain": ci(list_functions, "step_ratio_to_gain"),
        "GPU: wall clock to GRPO's peak": ci(gpu, "speedup_vs_reference"),
        "GPU: wall clock to GRPO-GA's peak": ci(gpu_vs_ga, "speedup_vs_reference"),
    }


def quotes(text: str, figure: tuple[str, ...]) -> bool:
    """Whether ``text`` gives ``figure``: its number followed by "×", and by its interval within
    a few words ("2.35× sooner on the training CPU clock [1.34–5.48]")."""
    text = text.replace("**", "").replace("95% CI ", "")
    pattern = rf"(?<![\d.]){re.escape(figure[0])}×"
    if len(figure) == 3:
        pattern += rf"[^\[\]\d]{{0,60}}\[{re.escape(figure[1])}–{re.escape(figure[2])}\]"
    return re.search(pattern, text) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_interval_is_a_committed_result(page):
    assert not unsupported(page.read_text(), committed_intervals()), \
        f"{page.name} quotes figures that no committed summary.json or report.md holds"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
@pytest.mark.parametrize("name", list(headline()))
def test_headline_figure_is_quoted(page, name):
    assert quotes(page.read_text(), headline()[name]), f"{page.name} does not quote {name}: {headline()[name]}"


def test_plan_validation_ratios():
    """README: plan's predicted step times as fractions of the confirmation's measured steps."""
    validation = json.loads((RESULTS / "plan_validation_confirm" / "validation.json").read_text())
    ratios = {m["method"]: m["ratio"] for m in validation["methods"]}
    quoted = f"{ratios['grpo']:.2f}, {ratios['pods']:.2f}, {ratios['grpo-ga']:.2f}"
    assert quoted in (ROOT / "README.md").read_text()
    assert all(abs(r - 1) <= validation["tolerance"] for r in ratios.values())  # the row says met


def test_readme_plot_is_committed():
    plots = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", (ROOT / "README.md").read_text())
    assert plots and all((ROOT / p).is_file() for p in plots)
    assert "benchmarks/results/evidence_confirm_a_arithmetic_2digit/accuracy_vs_steps.png" in plots


def test_a_stale_figure_is_caught():
    """The check fails on a figure no result holds: (a)'s step ratio as first reported, before
    it was recomputed (0.45× [0.38–1.13]; the committed summary holds [0.38–1.09])."""
    committed = committed_intervals()
    assert unsupported("PODS in 0.45× GRPO's steps [0.38–1.09], met", committed) == []
    assert unsupported("PODS in 0.45× GRPO's steps [0.38–1.13], met", committed) == ["PODS in 0.45× GRPO's steps [0.38–1.13]"]
    assert unsupported("**0.41×** [95% CI 0.33–0.78]", committed) == ["0.41× [95% CI 0.33–0.78]"]
    assert quotes("in **0.40× GRPO's optimizer steps** [95% CI 0.33–0.78]", ("0.40", "0.33", "0.78"))
    assert not quotes("in 0.40× GRPO's optimizer steps [0.33–0.79]", ("0.40", "0.33", "0.78"))
    assert not quotes("3.81× less memory", ("3.80",))
