"""benchmarks/evidence.py report: the comparisons' figures and targets on hand-made runs; the
drivers of the experiments (evidence.py, task_selection.py): one line and a non-zero exit on bad
arguments, missing or damaged results and failed runs, and a resume past a cut-short metrics line."""

import importlib.util
import json
import subprocess

import pytest

from conftest import REPO


@pytest.fixture
def evidence(monkeypatch):
    spec = importlib.util.spec_from_file_location("evidence", REPO / "benchmarks" / "evidence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "STEPS", 10)  # the hand-made runs finish at step 10
    return module


def write_run(folder, accuracies, cpu_per_step, steps=10):
    """Evaluations at steps 0, 5, 10 (``accuracies``), ``cpu_per_step`` training CPU seconds a
    step and twice that on the wall, as the trainer logs them: the step-0 evaluation on a line of
    its own, later ones in their step's record."""
    folder.mkdir(parents=True)
    rows = [{"step": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0, "eval_accuracy": accuracies[0], "eval_step": 0}]
    for step in range(1, steps + 1):
        row = {"step": step, "train_seconds": 2.0 * cpu_per_step * step, "train_cpu_seconds": cpu_per_step * step,
               "generation_s": 0.5 * cpu_per_step, "scoring_s": 0.0, "update_s": 0.25 * cpu_per_step}
        if step % 5 == 0:
            row.update(eval_accuracy=accuracies[step // 5], eval_step=step)
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_comparison_a_reads_steps_to_grpos_peak_and_max_variance_over_random(evidence, tmp_path):
    # every seed alike: GRPO peaks at 0.4 at step 10; PODS reaches 0.4 at step 5 (ratio 0.5);
    # random's curve crosses 0.4 between 0.3 at step 5 and 0.5 at step 10: at step 7.5, so
    # max-variance / random = 5 / 7.5. On time: GRPO 10 CPU s (1 a step), PODS 20 (4 a step).
    for seed in range(evidence.COMPARISONS["a"]["seeds"]):
        write_run(tmp_path / "grpo" / f"seed-{seed}", [0.1, 0.3, 0.4], 1.0)
        write_run(tmp_path / "pods" / f"seed-{seed}", [0.1, 0.4, 0.4], 4.0)
        write_run(tmp_path / "pods-random" / f"seed-{seed}", [0.1, 0.3, 0.5], 4.0)
    text = evidence.report("a", tmp_path)
    assert text == (tmp_path / "report.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 0.50 [0.50–0.50] | 0.50 [0.50–0.50] | 0.50 [0.50–0.50] | 4.0 | 2.0 | 1.0 |" in rows["pods"]
    assert "| 7.5 | 0.75 [0.75–0.75] |" in rows["pods-random"]  # steps to the peak and their ratio to GRPO's 10
    assert "max-variance / random, optimizer steps to GRPO's seed-mean peak: 0.67 [0.67–0.67]" in text
    assert "| PODS reaches GRPO's peak in at most 0.6x GRPO's steps, the interval's upper end below 1.0 | met |" in text
    assert "| max-variance needs fewer steps than random, the interval excluding 1.0 | met |" in text
    # per seed: GRPO's own peak, then steps and CPU seconds to it (random: the first evaluation at or above it)
    assert "| 0 | 0.400 | 10.0 | 10 | 5.0 | 20 | 7.5 | 40 |" in text
    assert "| step | grpo | pods | pods-random |" in text  # the seed-mean curves against steps
    assert "| 5 | 0.300 | 0.400 | 0.300 |" in text and "| 10 | 0.400 | 0.400 | 0.500 |" in text
    assert "Not finished" not in text


def test_comparison_b_on_time_with_a_run_unfinished(evidence, tmp_path):
    # GRPO-GA peaks at 0.4 at step 5, 8 CPU s a step: 40 s; PODS reaches 0.4 at step 10, 4 a step: 40 s
    for seed in range(evidence.COMPARISONS["b"]["seeds"]):
        write_run(tmp_path / "grpo-ga" / f"seed-{seed}", [0.1, 0.4, 0.4], 8.0)
        write_run(tmp_path / "pods" / f"seed-{seed}", [0.1, 0.3, 0.4], 4.0, steps=7 if seed == 2 else 10)
    text = evidence.report("b", tmp_path)
    assert "| PODS reaches GRPO-GA's peak at least 1.7x sooner (CPU clock), the interval's lower end above 1.0 | so far missed |" in text
    assert text.startswith(f"Comparison (b), {tmp_path.name}, over seeds 0-1: grpo-ga's seed-mean peak 0.400 at step 5 "
                           "on its curve against optimizer steps (the step figures), 0.400 at 40 training CPU s on its "
                           "curve against time (the speed-ups);")
    assert ("Not finished yet, and not in these figures: pods seed 2; the finished runs of seeds 2-4 wait for their "
            "seed's other runs.") in text
    pods = next(line for line in text.splitlines() if line.startswith("| pods |"))
    assert "| pods | 2 | 0.400 |" in pods and "| 1.00 [1.00–1.00] |" in pods  # 40 CPU s each to GRPO-GA's peak


@pytest.fixture
def chosen_task(evidence, tmp_path, monkeypatch):
    """A selection that chose arithmetic_2digit, with the results under tmp_path; returns the results folder."""
    results = tmp_path / "benchmarks" / "results"
    selection = results / "task_selection" / "summary.json"
    selection.parent.mkdir(parents=True)
    selection.write_text(json.dumps({"chosen": "arithmetic_2digit", "candidates": {"arithmetic_2digit": {"lr": "3e-5"}}}))
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    monkeypatch.setattr(evidence, "SELECTION", selection)
    return results


def one_line(code, err, message):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("evidence.py: error: ") and message in lines[0], err


def test_report_before_a_comparison_has_a_folder_is_one_line(evidence, chosen_task, capsys):
    code = evidence.main(["report", "b"])
    one_line(code, capsys.readouterr().err, f"comparison (b) has no runs yet: no folder "
                                            f"{chosen_task / 'evidence_b_arithmetic_2digit'}")


def test_report_of_a_damaged_metrics_line_names_the_file_and_line(evidence, chosen_task, capsys):
    out = chosen_task / "evidence_a_arithmetic_2digit"
    for seed in range(evidence.COMPARISONS["a"]["seeds"]):
        for method in ("grpo", "pods", "pods-random"):
            write_run(out / method / f"seed-{seed}", [0.1, 0.3, 0.4], 1.0)
    metrics = out / "pods" / "seed-1" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:2] + ['{"step": 2, "train_sec\n'] + lines[3:]))  # line 3 damaged
    code = evidence.main(["report", "a"])
    one_line(code, capsys.readouterr().err, f"{metrics}:3: not a podsrl log record")


@pytest.mark.parametrize("args,message", [
    (["c"], "argument what: invalid choice: 'c'"),
    (["report", "x"], "argument comparison: invalid choice: 'x'"),
])
def test_bad_arguments_are_one_line(evidence, capsys, args, message):
    one_line(evidence.main(args), capsys.readouterr().err, message)


def test_nothing_chosen_yet_is_one_line(evidence, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(evidence, "SELECTION", tmp_path / "summary.json")
    one_line(evidence.main(["a"]), capsys.readouterr().err, "no benchmark task has been chosen yet")


@pytest.fixture
def selection(monkeypatch, tmp_path):
    """benchmarks/task_selection.py with one candidate and one rate, its folders under tmp_path."""
    spec = importlib.util.spec_from_file_location("task_selection", REPO / "benchmarks" / "task_selection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "CANDIDATES", {"arithmetic_2digit": "configs/arithmetic_2digit.yaml"})
    monkeypatch.setattr(module, "LRS", ["1e-5"])
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(module, "training_elsewhere", lambda out: False)
    return module


def finished_metrics(steps: int) -> str:
    return "".join(json.dumps({"step": s, "train_seconds": float(s), "eval_step": s, "eval_accuracy": 0.1}) + "\n"
                   for s in range(0, steps + 1, 5))


def test_task_selection_resumes_a_killed_run_past_its_cut_short_last_metrics_line(selection, monkeypatch, capsys):
    out = selection.RUNS / "arithmetic_2digit" / "lr1e-5" / "seed-0"
    (out / "checkpoints" / "step-000010").mkdir(parents=True)
    (out / "metrics.jsonl").write_text(finished_metrics(10) + '{"step": 11, "train_sec')  # killed while writing
    commands = []

    def trainer(cmd, **kwargs):  # the resumed run: it finishes, as podsrl train would
        commands.append(cmd)
        (out / "metrics.jsonl").write_text(finished_metrics(selection.STEPS))
        (out / "config.yaml").write_text("seed: 0\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(selection.subprocess, "run", trainer)
    assert selection.main(["run", "--jobs", "1"]) == 0
    assert len(commands) == 1 and "resume=true" in commands[0]
    assert capsys.readouterr().out.startswith("arithmetic_2digit lr=1e-5 seed=0: 0:0.100 5:0.100")


def test_task_selection_exits_non_zero_on_a_failed_run_saying_it_on_stderr(selection, monkeypatch, capsys):
    monkeypatch.setattr(selection.subprocess, "run", lambda cmd, **kwargs: subprocess.CompletedProcess(
        cmd, 2, "", "loading\npodsrl: error: task.test_size=500 but data holds 300 test problems\n"))
    assert selection.main(["run"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["task_selection.py: error: arithmetic_2digit lr=1e-5 seed=0: the run failed "
                                         "(exit code 2): podsrl: error: task.test_size=500 but data holds 300 test problems"]


@pytest.mark.parametrize("args,message", [
    (["run", "--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["run", "--stage", "all"], "argument --stage: invalid choice: 'all'"),
    ([], "the following arguments are required: command"),
])
def test_task_selection_bad_arguments_are_one_line(selection, capsys, args, message):
    code = selection.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("task_selection.py: error: ") and message in lines[0]


def test_task_selection_damaged_metrics_line_is_one_line(selection, capsys):
    result = selection.RESULTS / "arithmetic_2digit" / "lr1e-5" / "seed-0"
    result.mkdir(parents=True)
    (result / "metrics.jsonl").write_text('{"step": 0, "eval_step": 0, "eval_accuracy": 0.1}\nnot json\n{"step": 5}\n')
    code = selection.main(["report"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines == [f"task_selection.py: error: {result / 'metrics.jsonl'}:2: not a podsrl log record "
                                   "(Expecting value)"]
