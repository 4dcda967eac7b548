"""podsrl compare: time-to-GRPO-peak arithmetic on hand-made curves; resume and extend."""

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO, last_wins
from podsrl.compare import finished_at, markdown_table, parse_methods, summarise, write_reports
from podsrl.config import load_config
from podsrl.errors import PodsError


def write_run(folder, evals, step_rows=()):
    folder.mkdir(parents=True)
    lines = [{"step": i, "train_seconds": t, "eval_accuracy": a} for i, (t, a) in enumerate(evals)]
    lines += [{"step": s, "train_seconds": t, "generation_s": g, "scoring_s": g / 10, "update_s": u, "update_peak_memory_mb": mb,
               "rollouts_generated": 16 * s} for s, t, g, u, mb in step_rows]
    lines.sort(key=lambda r: (r["train_seconds"], "eval_accuracy" not in r))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))


def test_summary_hand_computed(tmp_path):
    """Both seeds of each method are its seed-mean curve shifted by +0.1 and -0.1, so every paired
    resample of seeds shifts the reference's target by the same amount as the curves: each
    interval is its point."""
    # GRPO, 10 s a step, evaluated at steps 0-3: seed-mean 0.1, 0.4, 0.5, 0.6. Final level: the
    # mean of the last three, 0.5; gain 0.5 - 0.1 = 0.4; 90% of it: 0.1 + 0.36 = 0.46, reached
    # between step 1 (0.4) and 2 (0.5) at 1 + 0.06 / 0.1 = 1.6 steps, 16 s. Peak 0.6 at step 3, 30 s.
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.5), (20, 0.6), (30, 0.7)],
              [(1, 10, 1.0, 3.0, 100), (2, 20, 2.0, 5.0, 120)])
    write_run(tmp_path / "grpo" / "seed-1", [(0, 0.0), (10, 0.3), (20, 0.4), (30, 0.5)])
    # PODS, 20 s a step: seed-mean 0.1, 0.5, 0.6, 0.6. It reaches 0.46 at 0.36 / 0.4 = 0.9 steps
    # (ratio 0.9 / 1.6 = 0.5625), 18 s (speed-up 16 / 18); GRPO's peak 0.6 at step 2 (ratio 2 / 3),
    # 40 s (speed-up 30 / 40).
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.2), (20, 0.6), (40, 0.7), (60, 0.7)], [(1, 20, 4.0, 3.0, 90)])
    write_run(tmp_path / "pods" / "seed-1", [(0, 0.0), (20, 0.4), (40, 0.5), (60, 0.5)])
    # GRPO-GA: seed-mean 0.1, 0.15, 0.2, 0.25: never reaches either target
    write_run(tmp_path / "grpo-ga" / "seed-0", [(0, 0.2), (50, 0.25), (100, 0.3), (150, 0.35)])
    write_run(tmp_path / "grpo-ga" / "seed-1", [(0, 0.0), (50, 0.05), (100, 0.1), (150, 0.15)])
    # a method run on seed 1 alone is measured against GRPO's seed 1: 0.0, 0.3, 0.4, 0.5, final
    # level 0.4, target 0.36 at 1.6 steps (16 s), peak 0.5 at step 3 (30 s). It goes 0.0, 0.45, 0.5
    # at 0, 5, 8 s: 0.36 at 0.8 steps, 4 s (ratio 0.5, speed-up 4); 0.5 at step 2, 8 s (30 / 8).
    write_run(tmp_path / "pods-part" / "seed-1", [(0, 0.0), (5, 0.45), (8, 0.5)])
    s = summarise(tmp_path, ["grpo", "pods", "grpo-ga", "pods-part"], 2)
    assert s["reference_base_accuracy"] == pytest.approx(0.1) and s["reference_final_level"] == pytest.approx(0.5)
    assert s["reference_target_accuracy"] == pytest.approx(0.46) and s["reference_steps_to_gain"] == pytest.approx(1.6)
    assert s["reference_time_to_gain_s"] == pytest.approx(16) and s["reference_peak_accuracy"] == pytest.approx(0.6)
    assert s["reference_steps_to_peak"] == 3 and s["reference_time_to_peak_s"] == 30
    pods, grpo, ga, part = (s["methods"][m] for m in ("pods", "grpo", "grpo-ga", "pods-part"))
    assert pods["steps_to_gain"] == pytest.approx(0.9) and pods["time_to_gain_s"] == pytest.approx(18)
    assert pods["step_ratio_to_gain"] == pytest.approx(0.5625) and pods["speedup_to_gain"] == pytest.approx(16 / 18)
    assert pods["step_ratio_to_gain_ci95"] == pytest.approx([0.5625, 0.5625]) and pods["step_ratio_to_gain_never"] == 0
    assert pods["step_ratio_vs_reference"] == pytest.approx(2 / 3) and pods["speedup_vs_reference"] == pytest.approx(0.75)
    # mean accuracy over steps 0-3, trapezoids: GRPO (0.25 + 0.45 + 0.55) / 3, PODS (0.3 + 0.55 + 0.6) / 3.
    # Over the shorter time budget, GRPO's 30 s: GRPO the same; PODS to 30 s, where its curve is
    # 0.55 (between 0.5 at 20 s and 0.6 at 40 s): (0.3 * 20 + 0.525 * 10) / 30 = 0.375
    assert pods["mean_accuracy_steps"] == pytest.approx(1.45 / 3)
    assert pods["mean_accuracy_steps_diff"] == pytest.approx(0.2 / 3)
    assert pods["mean_accuracy_steps_diff_ci95"] == pytest.approx([0.2 / 3, 0.2 / 3])
    assert pods["mean_accuracy_time"] == pytest.approx(0.375)
    assert pods["mean_accuracy_time_diff"] == pytest.approx(0.375 - 1.25 / 3)
    assert pods["final_level"] == pytest.approx(1.7 / 3) and pods["final_level_diff"] == pytest.approx(1.7 / 3 - 0.5)
    assert grpo["step_ratio_to_gain"] == 1.0 and grpo["speedup_to_gain"] == 1.0 and grpo["mean_accuracy_steps_diff"] == 0
    # never reached: no figure; every resample says never (ratio ∞, speed-up 0)
    assert ga["steps_to_gain"] is None and ga["step_ratio_to_gain"] is None and ga["speedup_to_gain"] is None
    assert ga["speedup_vs_reference"] is None and ga["step_ratio_to_gain_never"] == 2000
    assert ga["step_ratio_to_gain_ci95"] == [math.inf, math.inf] and ga["speedup_to_gain_ci95"] == [0.0, 0.0]
    # per seed, against the same seed's GRPO run (each the seed mean shifted: the same figures)
    assert [p["step_ratio_to_gain"] for p in pods["per_seed"]] == pytest.approx([0.5625, 0.5625])
    assert [p["speedup_vs_reference"] for p in pods["per_seed"]] == pytest.approx([0.75, 0.75])
    assert [p["time_to_reference_peak_s"] for p in ga["per_seed"]] == [None, None]
    # sample SD of the peaks 0.7 and 0.5: sqrt((0.1² + 0.1²) / (2 - 1)) = 0.141 (a population SD: 0.1)
    assert pods["spread"]["peak_accuracy_std"] == pytest.approx(0.02 ** 0.5)
    assert part["reference_target_accuracy_same_seeds"] == pytest.approx(0.36) and part["steps_to_gain"] == pytest.approx(0.8)
    assert part["step_ratio_to_gain"] == pytest.approx(0.5) and part["speedup_to_gain"] == pytest.approx(4)
    assert part["speedup_vs_reference"] == pytest.approx(30 / 8) and part["step_ratio_vs_reference"] == pytest.approx(2 / 3)
    # over steps 0-2 (its budget): GRPO (0.15 + 0.35) / 2, it (0.225 + 0.475) / 2; one seed, no interval
    assert part["mean_accuracy_steps_diff"] == pytest.approx(0.1) and part["mean_accuracy_steps_diff_ci95"] is None
    assert grpo["per_seed"][0]["generation_s_per_step"] == 1.5 and grpo["per_seed"][0]["update_peak_memory_mb"] == 120
    assert grpo["per_seed"][0]["scoring_s_per_step"] == pytest.approx(0.15) and grpo["scoring_s_per_step"] == pytest.approx(0.15)
    assert grpo["per_seed"][0]["rollouts_per_step"] == 24 and pods["per_seed"][0]["rollouts_per_step"] == 16
    # sensitivity, on the seed-mean curves GRPO 0.1, 0.4, 0.5, 0.6 and PODS 0.1, 0.5, 0.6, 0.6 (steps 0-3).
    # Last 3: GRPO's final level 0.5. 80% of the gain: 0.42, GRPO at 1 + 0.02 / 0.1 = 1.2, PODS at
    # 0.32 / 0.4 = 0.8 (ratio 2/3); 95%: 0.48 at 1.8 against 0.95. Last 5 (all four): final level 0.4,
    # gain 0.3; the target is q * 0.3 above 0.1, GRPO's at step q, PODS's at q * 0.3 / 0.4: ratio 0.75
    cells = {(c["q"], c["final_window"]): c for c in pods["sensitivity"]}
    assert [cells[k]["step_ratio_to_gain"] for k in [(0.8, 3), (0.9, 3), (0.95, 3)]] == pytest.approx([2 / 3, 0.5625, 0.95 / 1.8])
    assert [cells[q, 5]["step_ratio_to_gain"] for q in (0.8, 0.9, 0.95)] == pytest.approx([0.75] * 3)
    assert cells[0.9, 3]["step_ratio_to_gain_ci95"] == pods["step_ratio_to_gain_ci95"] and cells[0.9, 3]["step_ratio_to_gain_never"] == 0
    assert all(c["step_ratio_to_gain"] is None and c["step_ratio_to_gain_never"] == 2000 for c in ga["sensitivity"])
    # per seed: both seeds 0.5625 against their own GRPO runs, so their geometric mean; GRPO-GA never
    assert pods["step_ratio_to_gain_per_seed_geomean"] == pytest.approx(0.5625)
    assert pods["step_ratio_to_gain_per_seed_geomean_ci95"] == pytest.approx([0.5625, 0.5625])
    assert ga["step_ratio_to_gain_per_seed_geomean"] is None and ga["step_ratio_to_gain_per_seed_geomean_never"] == 2000
    assert part["step_ratio_to_gain_per_seed_geomean"] == pytest.approx(0.5) and part["step_ratio_to_gain_per_seed_geomean_ci95"] is None
    write_reports(tmp_path, s)
    table = (tmp_path / "summary.md").read_text()
    assert "90% of its gain is 0.460, reached at step 1.6, 16 s of training" in table
    assert "Sensitivity, not a second chance: the step ratio above is the figure, at 90% of GRPO's gain" in table
    assert "| method | 80%, last 3 | 80%, last 5 | 90%, last 3 | 90%, last 5 | 95%, last 3 | 95%, last 5 |" in table
    assert ("| pods | 0.67 [0.67–0.67] (never 0/2000) | 0.75 [0.75–0.75] (never 0/2000) | 0.56 [0.56–0.56] (never 0/2000) "
            "| 0.75 [0.75–0.75] (never 0/2000) | 0.53 [0.53–0.53] (never 0/2000) | 0.75 [0.75–0.75] (never 0/2000) |") in table
    assert "| grpo-ga | never [inf–inf] (never 2000/2000) |" in table
    assert "| pods | 0.56, 0.56 | 0.56 [0.56–0.56] (never 0/2000) |" in table
    assert "| grpo-ga | never, never | never [inf–inf] (never 2000/2000) |" in table
    assert "| pods-part | 0.50 | 0.50 |" in table
    assert "| pods | 2 | 0.9 | 0.56 [0.56–0.56] (never 0/2000) | 18 | 0.89 [0.89–0.89] (never 0/2000) | 0.483 | +0.067 [+0.067–+0.067] |" in table
    assert "| grpo-ga | 2 | n/a | never [inf–inf] (never 2000/2000) |" in table
    assert "The paper's statistic: first reaches GRPO's seed-mean peak" in table
    assert "| pods | 0.600 ± 0.141 |" in table and "| 0.75, 0.75 |" in table
    assert "pods-part (seeds 1: GRPO's peak 0.500)" in table
    assert "| score s/step |" in table and "| 10.0 | 1.5 | 0.15 | 4.0 | 120 |" in table
    assert (tmp_path / "accuracy_vs_time.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["methods"]["pods"]["speedup_vs_reference"] == pytest.approx(0.75)
    strict = json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda token: pytest.fail(token))
    assert strict["methods"]["grpo-ga"]["step_ratio_to_gain_ci95"] == [None, None]  # never: inf, written null


def test_sampler_statistics_per_step_and_the_zero_advantage_share():
    from podsrl.compare import sampler_statistics

    steps = [{"prompts_skipped": 2, "groups_filtered": 0, "dynamic_rounds": 1, "adaptive_rounds": 3,
              "skipped_zero_advantage": 8, "trained_sequences": 32},
             {"prompts_skipped": 0, "groups_filtered": 3, "dynamic_rounds": 2, "adaptive_rounds": 4,
              "skipped_zero_advantage": 0, "trained_sequences": 16}]
    assert sampler_statistics(steps) == {"prompts_skipped_per_step": 1.0, "groups_filtered_per_step": 1.5,
                                         "dynamic_rounds_per_step": 1.5, "adaptive_rounds_per_step": 3.5,
                                         "zero_advantage_fraction": 8 / 48}
    old = sampler_statistics([{"generation_s": 1.0}])  # metrics written before the sampler's keys
    assert set(old.values()) == {None}


def curve(*points):
    return [{"train_seconds": t, "eval_accuracy": a} for t, a in points]


def test_methods_parse():
    base = load_config(None, ["n=32", "m=8"])
    methods = parse_methods(["grpo,pods", "grpo-ga", "pods-random:rule=random,n=16"], base)
    assert methods == {"grpo": ["mode=grpo", "n=8"], "pods": ["mode=pods"], "grpo-ga": ["mode=grpo-ga"],
                       "pods-random": ["mode=pods", "rule=random", "n=16"]}
    with pytest.raises(PodsError, match="grpo"):
        parse_methods(["pods"], base)


@pytest.mark.slow
def test_compare_runs_resumes_and_extends(tiny_model_dir, tmp_path):
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]"]
    out = tmp_path / "cmp"
    first = run_all(None, args, ["grpo,pods"], 1, 0.001, out, 0.2, keep="checkpoint")  # stops after one step
    steps_before = first["methods"]["pods"]["per_seed"][0]["steps"]
    again = run_all(None, args, ["grpo,pods"], 1, 0.001, out, 0.2, keep="checkpoint")  # finished: nothing retrained
    assert again["methods"]["pods"]["per_seed"][0]["steps"] == steps_before
    spent = max(first["methods"][m]["per_seed"][0]["train_seconds"] for m in ("grpo", "pods"))
    longer = run_all(None, args, ["grpo,pods"], 1, 4 * spent / 60, out, 0.2, keep="checkpoint")  # extended from the checkpoint
    rows = [json.loads(l) for l in (out / "pods" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert longer["methods"]["pods"]["per_seed"][0]["steps"] > steps_before
    assert [r["step"] for r in rows if r["step"] == 0] == [0]  # the base evaluation was not redone
    # committed results keep their metrics but not their checkpoints: still done, not retrained
    metrics = (out / "pods" / "seed-0" / "metrics.jsonl").read_text()
    for run in ("grpo", "pods"):
        shutil.rmtree(out / run / "seed-0" / "checkpoints")
    run_all(None, args, ["grpo,pods"], 1, 4 * spent / 60, out, 0.2, keep="checkpoint")
    assert (out / "pods" / "seed-0" / "metrics.jsonl").read_text() == metrics
    assert not (out / "pods" / "seed-0" / "checkpoints").exists()


@pytest.mark.slow
def test_a_step_budget_evaluates_every_method_at_the_same_steps_against_another_reference(tiny_model_dir, tmp_path):
    from podsrl.compare import recorded_reference, run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]"]
    out = tmp_path / "cmp"
    s = run_all(None, args, ["grpo-ga,pods"], 2, None, out, None, steps=3, eval_every=2, reference="grpo-ga")
    for m in ("grpo-ga", "pods"):
        for seed in (0, 1):
            rows = [json.loads(l) for l in (out / m / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2, 3]  # every eval_every steps, and the last
            assert max(r["step"] for r in rows) == 3
    assert s["reference"] == "grpo-ga" and recorded_reference(out) == "grpo-ga"
    gains = s["reference_peak_accuracy"] > s["reference_base_accuracy"]  # against itself: 1, or n/a with no gain
    assert s["methods"]["grpo-ga"]["step_ratio_vs_reference"] == (1.0 if gains else None)
    assert "step_ratio_vs_reference_ci95" in s["methods"]["pods"]
    assert "grpo-ga's seed-mean curve (aligned by optimizer step)" in (out / "summary.md").read_text()
    assert yaml.safe_load((out / "compare.yaml").read_text())["steps"] == 3
    before = (out / "pods" / "seed-1" / "metrics.jsonl").read_text()
    run_all(None, args, ["grpo-ga,pods"], 2, None, out, None, steps=3, eval_every=2, reference="grpo-ga")  # done: kept
    assert (out / "pods" / "seed-1" / "metrics.jsonl").read_text() == before
    with pytest.raises(PodsError, match="compare needs the grpo-ga method"):
        run_all(None, args, ["grpo,pods"], 1, None, tmp_path / "x", None, steps=3, eval_every=2, reference="grpo-ga")


def test_times_on_the_cpu_clock(tmp_path):
    """--clock cpu: times are read from train_cpu_seconds; wall times stay in the records."""
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.5), (20, 0.6)])
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.2), (10, 0.6)])
    for method, cpu_share in (("grpo", 0.5), ("pods", 0.8)):  # pods waited less for the CPU
        path = tmp_path / method / "seed-0" / "metrics.jsonl"
        rows = [json.loads(l) for l in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "train_cpu_seconds": r["train_seconds"] * cpu_share}) + "\n" for r in rows))
    wall = summarise(tmp_path, ["grpo", "pods"], 1)
    cpu = summarise(tmp_path, ["grpo", "pods"], 1, clock="cpu")
    assert wall["methods"]["pods"]["speedup_vs_reference"] == pytest.approx(2.0)  # 20 s against 10 s
    assert cpu["methods"]["pods"]["speedup_vs_reference"] == pytest.approx(10 / 8)  # 10 CPU s against 8
    assert cpu["reference_time_to_peak_s"] == pytest.approx(10) and cpu["clock"] == "cpu"
    write_reports(tmp_path, cpu)
    assert "(CPU seconds of the training process)" in (tmp_path / "summary.md").read_text()
    write_run(tmp_path / "old" / "grpo" / "seed-0", [(0, 0.2), (10, 0.5)])
    with pytest.raises(PodsError, match="lacks train_cpu_seconds"):
        summarise(tmp_path / "old", ["grpo"], 1, clock="cpu")
    with pytest.raises(PodsError, match="lacks train_cpu_seconds"):  # compare --clock cpu reusing such a run
        finished_at(tmp_path / "old" / "grpo" / "seed-0", "train_cpu_seconds")


def test_an_interrupted_run_resumes_from_its_last_save_every_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    import podsrl.trainer as trainer_module
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]"]
    out = tmp_path / "cmp"
    update = trainer_module.update

    def interrupted_at_step_3(s, c, rollouts, chosen, step):
        if step == 3:
            raise KeyboardInterrupt
        return update(s, c, rollouts, chosen, step)

    monkeypatch.setattr(trainer_module, "update", interrupted_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_all(None, args, ["grpo"], 1, None, out, None, steps=4, eval_every=2, save_every=2)
    assert (out / "grpo" / "seed-0" / "checkpoints" / "step-000002").is_dir()
    monkeypatch.setattr(trainer_module, "update", update)
    # saving more often changes no result: the resume takes it (a long comparison switched to every step)
    run_all(None, args, ["grpo"], 1, None, out, None, steps=4, eval_every=2, save_every=1)
    assert "save_every: 1" in (out / "grpo" / "seed-0" / "config.yaml").read_text()
    rows = [json.loads(l) for l in (out / "grpo" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "update_s" in r] == [1, 2, 3, 4]  # steps 1-2 kept, 3-4 trained on resume
    assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2, 4]


def tiny_compare_args(tiny_model_dir) -> list[str]:
    return [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]"]


@pytest.mark.slow
def test_a_finished_comparison_is_not_reused_under_another_config(tiny_model_dir, tmp_path):
    from podsrl.compare import run_all

    args, out = tiny_compare_args(tiny_model_dir), tmp_path / "cmp"
    run_all(None, args, ["grpo,pods"], 1, 0.001, out, 0.2)
    metrics = (out / "pods" / "seed-0" / "metrics.jsonl").read_text()
    with pytest.raises(PodsError, match=r"reuse grpo seed 0 in .*n: 2 -> 4; m: 2 -> 4.*allow_config_change"):
        run_all(None, args + ["n=8", "m=4"], ["grpo,pods"], 1, 0.001, out, 0.2)
    with pytest.raises(PodsError, match=r"reuse pods seed 0 in .*rule: 'max_variance' -> 'random'"):
        run_all(None, args, ["grpo", "pods:rule=random"], 1, 0.001, out, 0.2)
    with pytest.raises(PodsError, match=r"time_budget_s: 0.06 -> 0.03"):  # a shorter budget than the runs had
        run_all(None, args, ["grpo,pods"], 1, 0.0005, out, 0.2)
    assert (out / "pods" / "seed-0" / "metrics.jsonl").read_text() == metrics  # nothing was retrained
    # a new method and a new seed extend the comparison; the runs already there are reused
    summary = run_all(None, args, ["grpo,pods", "pods-random:rule=random"], 2, 0.001, out, 0.2)
    assert (out / "pods" / "seed-0" / "metrics.jsonl").read_text() == metrics
    assert {m: len(r["per_seed"]) for m, r in summary["methods"].items()} == {"grpo": 2, "pods": 2, "pods-random": 2}
    # forced: the recorded runs are taken as they are
    forced = run_all(None, args + ["n=8", "m=4"], ["grpo,pods"], 1, 0.001, out, 0.2, allow_config_change=True)
    assert forced["methods"]["pods"]["per_seed"][0]["steps"] == summary["methods"]["pods"]["per_seed"][0]["steps"]


def test_a_rerun_replays_an_interrupted_run_saying_so(tiny_model_dir, tmp_path, capsys):
    """A compare run checkpoints only at its end: one interrupted after a step keeps its metrics and
    no checkpoint, and a rerun replays that step (its record kept, checked), trains on, and says so."""
    from podsrl import rundir
    from podsrl.compare import run_all

    args, out = tiny_compare_args(tiny_model_dir), tmp_path / "cmp"
    run_all(None, args, ["grpo"], 1, 0.001, out, 0.2)
    run = out / "grpo" / "seed-0"
    rows = (run / "metrics.jsonl").read_text().splitlines()
    step_1 = {k: v for k, v in json.loads(rows[1]).items() if not k.startswith("eval_")}
    (run / "metrics.jsonl").write_text(f"{rows[0]}\n{json.dumps(step_1)}\n")  # stopped after step 1, before its evaluation
    (run / rundir.LOCK).touch()
    capsys.readouterr()
    run_all(None, args, ["grpo"], 1, 0.001, out, 0.2)
    assert ("[1/1] grpo seed 0: its earlier run stopped after step 1 without a checkpoint: replaying steps 1-1 "
            "(trained again without evaluation, each checked against its record), then training on") in capsys.readouterr().out
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[:2] == [rows[0], json.dumps(step_1)]  # the logged steps as they were
    steps = [json.loads(l)["step"] for l in lines]
    assert steps.count(0) == 1 and steps == sorted(steps) and len(steps) > 2


def test_a_replay_that_differs_trains_the_run_again_from_step_0(tiny_model_dir, tmp_path, capsys):
    """A replayed step whose record it does not reproduce (here, a reward mean written otherwise):
    compare says so and trains the run again from step 0, its metrics replaced."""
    from podsrl import rundir
    from podsrl.compare import run_all

    args, out = tiny_compare_args(tiny_model_dir), tmp_path / "cmp"
    run_all(None, args, ["grpo"], 1, 0.001, out, 0.2)
    run = out / "grpo" / "seed-0"
    rows = (run / "metrics.jsonl").read_text().splitlines()
    step_1 = {k: v for k, v in json.loads(rows[1]).items() if not k.startswith("eval_")} | {"generated_reward_mean": -1.0}
    (run / "metrics.jsonl").write_text(f"{rows[0]}\n{json.dumps(step_1)}\n")
    (run / rundir.LOCK).touch()
    capsys.readouterr()
    run_all(None, args, ["grpo"], 1, 0.001, out, 0.2)
    printed = capsys.readouterr().out
    assert "differs from its record (generated_reward_mean: logged -1.0, replayed" in printed
    assert "training it again from step 0 (its later metrics replaced)" in printed
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records].count(0) == 1 and -1.0 not in [r.get("generated_reward_mean") for r in records]


def test_one_comparison_at_a_time_writes_into_an_out_folder(tiny_model_dir, tmp_path):
    """Two compares into one --out both went on where their first runs differed (each run's own
    lock was all there was), writing the same compare.yaml and summary."""
    from podsrl import rundir
    from podsrl.compare import run_all

    out = tmp_path / "cmp"
    with rundir.comparison_lock(out):  # as another podsrl compare holds it
        with pytest.raises(PodsError, match=rf"^--out {out} is in use by another podsrl compare \(pid {os.getpid()}\)$"):
            run_all(None, tiny_compare_args(tiny_model_dir), ["pods,grpo"], 1, 0.001, out, 0.2)
        assert [p.name for p in out.iterdir()] == [rundir.COMPARE_LOCK]  # nothing trained, nothing recorded
    assert not any(out.iterdir())  # and the lock goes with its holder


def test_reports_and_the_record_are_replaced_whole(tmp_path, monkeypatch):
    """A write cut short (a full disk, a kill) leaves the previous summary.json, summary.md and
    compare.yaml, not a torn one."""
    from podsrl.compare import _record, write_reports

    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.5)])
    summary = summarise(tmp_path, ["grpo"], 1)
    write_reports(tmp_path, summary)
    _record(tmp_path, None, ["n=8"], {"grpo": ["mode=grpo"]}, 1, 1.0, 10.0)
    names = ("summary.json", "summary.md", "compare.yaml")
    before = {name: (tmp_path / name).read_text() for name in names}
    real_write_text = Path.write_text

    def cut_short(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(PodsError, match=f"cannot write {tmp_path / 'summary.json'}: No space left on device"):
        write_reports(tmp_path, summary)
    with pytest.raises(PodsError, match=f"cannot write {tmp_path / 'compare.yaml'}: No space left on device"):
        _record(tmp_path, None, ["n=8"], {"grpo": ["mode=grpo"]}, 1, 1.0, 10.0)
    assert {name: (tmp_path / name).read_text() for name in names} == before
    assert not list(tmp_path.glob(".*.tmp"))  # the torn copies removed


@pytest.mark.slow
def test_finished_runs_keep_metrics_only_unless_asked(tiny_model_dir, tmp_path):
    from podsrl.compare import run_all

    args = tiny_compare_args(tiny_model_dir)
    run_all(None, args, ["grpo"], 1, 0.001, tmp_path / "a", 0.2)
    run_all(None, args, ["grpo"], 1, 0.001, tmp_path / "b", 0.2, keep="model")
    run_all(None, args, ["grpo"], 1, 0.001, tmp_path / "c", 0.2, keep="checkpoint")
    kept = {name: sorted(p.name for p in (tmp_path / name / "grpo" / "seed-0").iterdir()) for name in "abc"}
    assert kept["a"] == ["config.yaml", "metrics.jsonl", "podsrl_commit.txt"]  # and the code that made it
    assert kept["b"] == ["config.yaml", "final_model", "metrics.jsonl", "podsrl_commit.txt"]
    assert kept["c"] == ["checkpoints", "config.yaml", "metrics.jsonl", "podsrl_commit.txt"]
    assert (tmp_path / "b" / "grpo" / "seed-0" / "final_model" / "model.safetensors").is_file()
    # a pruned run is done: a rerun retrains nothing
    metrics = (tmp_path / "a" / "grpo" / "seed-0" / "metrics.jsonl").read_text()
    run_all(None, args, ["grpo"], 1, 0.001, tmp_path / "a", 0.2)
    assert (tmp_path / "a" / "grpo" / "seed-0" / "metrics.jsonl").read_text() == metrics


@pytest.mark.parametrize("specs,message", [
    (["grpo,podss"], "unknown method 'podss'"),
    (["grpo", "x:rule=random", "x:rule=percentile"], "method 'x' is given twice"),
    (["grpo,pods,pods"], "method 'pods' is given twice"),
    (["grpo", "../escape:rule=random"], "method name '../escape' must be"),
    (["grpo", "a/b:n=8"], "method name 'a/b' must be"),
    (["grpo,n=8"], "method override 'n=8' must follow a definition"),
    (["pods"], "compare needs the grpo method"),
])
def test_bad_method_specs(specs, message):
    with pytest.raises(PodsError, match=re.escape(message)):
        parse_methods(specs, load_config(None, ["n=32", "m=8"]))


def test_a_custom_method_after_builtins_in_one_spec():
    methods = parse_methods(["grpo,pods:rule=random,n=16", "p2:rule=percentile"], load_config(None, ["n=32", "m=8"]))
    assert methods == {"grpo": ["mode=grpo", "n=8"], "pods": ["mode=pods", "rule=random", "n=16"],
                       "p2": ["mode=pods", "rule=percentile"]}


def test_a_peak_at_the_first_evaluation_is_reached_at_time_zero_and_times_nothing(tmp_path):
    # GRPO never improves on its base model: its peak is at 0 s, and so is every method's; a
    # target it never gained times nothing: the speed-ups are n/a, not 1.00 [1.00-1.00]
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.5), (10, 0.4)])
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.5), (10, 0.45)])
    s = summarise(tmp_path, ["grpo", "pods"], 1)
    assert s["reference_time_to_peak_s"] == 0
    for m in ("grpo", "pods"):
        assert s["methods"][m]["time_to_reference_peak_s"] == 0 and s["methods"][m]["speedup_vs_reference"] is None
        assert s["methods"][m]["per_seed"][0]["speedup_vs_reference"] is None
        assert s["methods"][m]["seeds_reaching_reference_peak"] == 1
    assert "| pods | 1 | 0.0 | n/a | 0 | n/a |" in markdown_table(s)


# --------------------------------------------------------------------------- plot and the CLI


def cli(capsys, *args):
    from podsrl.cli import main

    code = main(last_wins(args))
    return code, capsys.readouterr()


def one_error(code, captured, message):
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("podsrl: error: ") and message in lines[0], captured.err


@pytest.mark.parametrize("content,message", [
    (b"", "holds no evaluated compare run of grpo"),
    (b'{"step": 0, "train_seconds": 0, "eval_accuracy": 0.5}\n{"step": 1, "train_sec\n{"step": 2}\n', "metrics.jsonl:2: not a podsrl log record"),
    (b"garbage\nmore garbage\n", "metrics.jsonl:1: not a podsrl log record"),
    (b"\x00\x9f\x92\x96\xff" * 20, "metrics.jsonl: not a podsrl log (not UTF-8 text)"),
    (b'{"step": 0, "train_seconds": "soon", "eval_accuracy": 0.5}\n', "not a podsrl metrics record"),
    (b'[1, 2]\n', "metrics.jsonl:1: not a podsrl log record (no step)"),
])
def test_plot_of_a_broken_metrics_file_is_one_line(capsys, tmp_path, content, message):
    (tmp_path / "grpo" / "seed-0").mkdir(parents=True)
    (tmp_path / "grpo" / "seed-0" / "metrics.jsonl").write_bytes(content)
    one_error(*cli(capsys, "plot", str(tmp_path)), message)


def test_plot_reads_a_torn_last_line_ignores_other_folders_and_names_missing_seeds(capsys, tmp_path):
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.6)])
    write_run(tmp_path / "grpo" / "seed-1", [(0, 0.2), (10, 0.5)])
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.2), (5, 0.6)])
    with (tmp_path / "pods" / "seed-0" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "train_seconds": 12.0, "eval_acc')  # killed while writing
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "seed-0").mkdir()
    code, captured = cli(capsys, "plot", str(tmp_path))
    assert code == 0, captured.err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["methods"]) == ["grpo", "pods"] and summary["missing_runs"] == ["pods seed 1"]
    assert summary["methods"]["pods"]["per_seed"][0]["peak_accuracy"] == 0.6
    assert "Not in the table (no run, or no evaluation yet): pods seed 1." in captured.out
    assert captured.err.strip() == "podsrl: note: not in the table (no run, or no evaluation yet): pods seed 1"


def test_plot_against_another_reference_writes_its_own_summary_and_leaves_the_recorded_one(capsys, tmp_path):
    # one seed each. grpo-ga (20 s a step), steps 0-4: 0.1, 0.3, 0.5, 0.5, 0.5; final level
    # 0.5, gain 0.4, 90% of it 0.46, reached at step 2 - 0.04 / 0.2 = 1.8, 36 s; its peak 0.5 first at
    # step 2, 40 s. pods (10 s a step), steps 0-3: 0.1, 0.5, 0.5, 0.5: 0.46 at step 0.9, 9 s (speed-up 36 / 9 = 4,
    # step ratio 0.5); the peak at step 1, 10 s (speed-up 4).
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.1), (30, 0.2), (60, 0.3), (90, 0.3)])
    write_run(tmp_path / "grpo-ga" / "seed-0", [(0, 0.1), (20, 0.3), (40, 0.5), (60, 0.5), (80, 0.5)])
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.1), (10, 0.5), (20, 0.5), (30, 0.5)])
    assert cli(capsys, "plot", str(tmp_path))[0] == 0
    recorded = (tmp_path / "summary.json").read_text()
    code, captured = cli(capsys, "plot", str(tmp_path), "--reference", "grpo-ga")
    assert code == 0, captured.err
    assert (tmp_path / "summary.json").read_text() == recorded
    s = json.loads((tmp_path / "summary_vs_grpo-ga.json").read_text())
    assert s["reference"] == "grpo-ga" and json.loads(recorded)["reference"] == "grpo"
    assert s["reference_steps_to_gain"] == pytest.approx(1.8) and s["reference_time_to_gain_s"] == pytest.approx(36)
    pods = s["methods"]["pods"]
    assert pods["step_ratio_to_gain"] == pytest.approx(0.5) and pods["speedup_to_gain"] == pytest.approx(4.0)
    assert pods["speedup_vs_reference"] == pytest.approx(4.0)
    assert "against grpo-ga" in captured.out
    assert captured.out == (tmp_path / "summary_vs_grpo-ga.md").read_text()
    one_error(*cli(capsys, "plot", str(tmp_path), "--reference", "grpo-gaa"), "--reference grpo-gaa: ")


@pytest.mark.parametrize("taken", ["summary.json", "summary.md", "accuracy_vs_time.png", "accuracy_vs_steps.png"])
def test_plot_into_a_folder_where_a_report_cannot_be_written_is_one_line(capsys, tmp_path, taken):
    # a folder where the report's name is taken fails as an unwritable folder does, for root too
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.6)])
    (tmp_path / taken).mkdir()
    one_error(*cli(capsys, "plot", str(tmp_path)), f"cannot write {tmp_path / taken}: ")


def test_compare_refuses_a_methods_reasoning_gym_settings_before_any_run_trains(capsys, tmp_path):
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "out"
    one_error(*cli(capsys, "compare", "task.name=gym", "task.dataset=chain_sum", "--methods",
                   "grpo,pods,pods-typo:task.dataset=chain_sun", "--steps", "1", "--seeds", "1", "--out", str(out)),
              "method 'pods-typo': unknown reasoning-gym data set 'chain_sun'; closest: chain_sum")
    assert not out.exists()  # grpo and pods, ahead of it, did not train


def test_compare_into_a_folder_that_cannot_be_written_is_one_line(capsys, tmp_path):
    out = tmp_path / "out"
    (out / ".podsrl-compare.lock").mkdir(parents=True)  # its lock cannot be written there, for root too
    one_error(*cli(capsys, "compare", "--steps", "1", "--seeds", "1", "--out", str(out)), f"cannot write --out {out}: ")


@pytest.mark.parametrize("args,message", [
    (["--budget-minutes", "nan"], "--budget-minutes must be a number > 0, got nan"),
    (["--budget-minutes", "inf"], "--budget-minutes must be a number > 0, got inf"),
    (["--eval-every-s", "nan"], "--eval-every-s must be a number > 0, got nan"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--first-seed", "-1"], "--first-seed must be >= 0, got -1"),
    (["--seeds", "two"], "argument --seeds: invalid int value: 'two'"),
    (["--keep", "everything"], "argument --keep: invalid choice: 'everything'"),
    (["--methods", "grpo,podss"], "unknown method 'podss'"),
    (["eval_every_s=nan"], "eval_every_s must be a finite number, got nan"),
    (["--steps", "10", "--budget-minutes", "3"], "--steps budgets optimizer steps; leave out --budget-minutes and --eval-every-s"),
    (["--eval-every", "5"], "--eval-every counts optimizer steps and goes with --steps"),
    (["--steps", "0"], "--steps and --eval-every must be >= 1, got 0 and"),
    (["--steps", "10", "--reference", "grpo-ga", "--methods", "grpo,pods"], "compare needs the grpo-ga method among --methods"),
])
def test_compare_arguments(capsys, tmp_path, args, message):
    one_error(*cli(capsys, "compare", str(REPO / "configs" / "smoke.yaml"), *args, "--out", str(tmp_path / "out")), message)
    assert not (tmp_path / "out").exists()


def test_compare_into_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    one_error(*cli(capsys, "compare", "--out", str(tmp_path / "file")), f"--out {tmp_path / 'file'} is a file, not a folder")


@pytest.mark.parametrize("args,message", [
    (["nonsense"], "argument command: invalid choice: 'nonsense'"),
    (["plot"], "the following arguments are required: out"),
])
def test_usage_errors_are_one_line(capsys, args, message):
    one_error(*cli(capsys, *args), message)


@pytest.mark.parametrize("args,message", [
    (["seed=3"], "seed is set by podsrl compare for each run (--seeds); remove it from the overrides"),
    (["steps=5"], "steps is set by podsrl compare for each run (--budget-minutes or --steps); remove it from the overrides"),
    (["output_dir=x"], "output_dir is set by podsrl compare for each run (--out)"),
    (["save_every=1"], "save_every is set by podsrl compare for each run (--save-every)"),
    (["eval_every_s=5"], "eval_every_s is set by podsrl compare for each run (--eval-every-s)"),
    (["--methods", "grpo", "x:seed=11"], "seed is set by podsrl compare for each run (--seeds); remove it from method 'x'"),
    (["--methods", "grpo", "x:rule=random,time_budget_s=9"], "time_budget_s is set by podsrl compare"),
    ([str(REPO / "configs" / "smoke.yaml")], "steps is set by podsrl compare for each run (--budget-minutes or --steps); remove it "
                                             "from the config file"),
])
def test_compare_refuses_the_settings_it_sets_itself(capsys, tmp_path, args, message):
    """They were replaced without a word, while compare.yaml recorded them as given."""
    one_error(*cli(capsys, "compare", *args, "--out", str(tmp_path / "out")), message)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_jobs_train_each_run_in_a_process_of_its_own_with_the_same_results(tiny_model_dir, tmp_path, monkeypatch):
    """--jobs 2: the runs train in spawned processes (this one's train is never called) and give
    the records one at a time gives, on the same machine, to the last bit."""
    import podsrl.trainer as trainer_module
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]", "threads=1"]
    run_all(None, args, ["grpo,pods"], 2, None, tmp_path / "one", None, steps=2, eval_every=1)

    def not_here(c, accelerator=None):
        raise AssertionError("trained in the comparing process")

    monkeypatch.setattr(trainer_module, "train", not_here)
    run_all(None, args, ["grpo,pods"], 2, None, tmp_path / "two", None, steps=2, eval_every=1, jobs=2)
    measured = ("_s", "_seconds", "_mb")  # times and memory: the rest of a record is computed
    for method in ("grpo", "pods"):
        for seed in (0, 1):
            rows = [[{k: v for k, v in json.loads(line).items() if not k.endswith(measured)}
                     for line in (tmp_path / folder / method / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()]
                    for folder in ("one", "two")]
            assert rows[0] == rows[1] and [r["step"] for r in rows[1] if "eval_accuracy" in r] == [0, 1, 2]
    assert not list((tmp_path / "two").glob("*/seed-*/checkpoints"))  # pruned as one at a time prunes


@pytest.mark.slow
def test_a_run_failing_in_its_process_stops_the_queue_and_says_why(tiny_model_dir, tmp_path):
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "threads=1", "rewards=[rewards_for_tests:raises]"]
    with pytest.raises(PodsError, match="reward 'rewards_for_tests:raises' raised ValueError: no answer column"):
        run_all(None, args, ["grpo"], 3, None, tmp_path / "cmp", None, steps=2, eval_every=1, jobs=2)
    assert not (tmp_path / "cmp" / "grpo" / "seed-2").exists()  # queued behind the failures: never started
    with pytest.raises(PodsError, match="--jobs must be >= 1"):
        run_all(None, args, ["grpo"], 1, None, tmp_path / "x", None, steps=2, eval_every=1, jobs=0)


def test_a_rerun_with_other_seeds_summarises_every_seed_held_and_records_the_seeds_run(tiny_model_dir, tmp_path):
    """As plot does: the summary of a rerun with --seeds 1 --first-seed 2 covers seed 0 of the first
    call too (seed 1, never run, is missing); compare.yaml lists the seeds run, 0 and 2."""
    from podsrl.compare import compared_methods, run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]", "threads=1"]
    out = tmp_path / "cmp"
    run_all(None, args, ["grpo"], 1, None, out, None, steps=1, eval_every=1)
    s = run_all(None, args, ["grpo"], 1, None, out, None, steps=1, eval_every=1, first_seed=2)
    assert s["seeds"] == [0, 1, 2] and s["missing_runs"] == ["grpo seed 1"]
    assert [p["seed"] for p in s["methods"]["grpo"]["per_seed"]] == [0, 2]
    assert yaml.safe_load((out / "compare.yaml").read_text())["seeds"] == [0, 2]
    assert compared_methods(out) == (["grpo"], [0, 1, 2])


def test_a_record_written_before_lists_its_seeds_as_a_count_from_first_seed(tmp_path):
    from podsrl.compare import compared_methods

    write_run(tmp_path / "grpo" / "seed-9", [(0, 0.2), (10, 0.5)])
    (tmp_path / "compare.yaml").write_text("methods: {grpo: []}\nseeds: 2\nfirst_seed: 8\n")
    assert compared_methods(tmp_path) == (["grpo"], [8, 9])
