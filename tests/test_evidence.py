"""benchmarks/evidence.py report: the comparisons' figures and targets on hand-made runs."""

import importlib.util
import json

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
