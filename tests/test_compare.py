"""podsrl compare: time-to-GRPO-peak arithmetic on hand-made curves; resume and extend."""

import json
import shutil

import pytest

from podsrl.compare import bootstrap_speedup, parse_methods, summarise, write_reports
from podsrl.config import load_config
from podsrl.errors import PodsError


def write_run(folder, evals, step_rows=()):
    folder.mkdir(parents=True)
    lines = [{"step": i, "train_seconds": t, "eval_accuracy": a} for i, (t, a) in enumerate(evals)]
    lines += [{"step": s, "train_seconds": t, "generation_s": g, "scoring_s": g / 10, "update_s": u, "update_peak_memory_mb": mb}
              for s, t, g, u, mb in step_rows]
    lines.sort(key=lambda r: (r["train_seconds"], "eval_accuracy" not in r))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))


def test_summary_hand_computed(tmp_path):
    # seed 0: GRPO peaks at 0.6, first reached at 20 s; PODS reaches 0.6 at 5 s: speed-up 4
    write_run(tmp_path / "grpo" / "seed-0", [(0, 0.2), (10, 0.5), (20, 0.6), (30, 0.55)], [(1, 10, 1.0, 3.0, 100), (2, 30, 2.0, 5.0, 120)])
    write_run(tmp_path / "pods" / "seed-0", [(0, 0.2), (5, 0.6), (10, 0.7)], [(1, 10, 4.0, 3.0, 90)])
    # seed 1: GRPO peaks at 0.4 at 10 s; PODS reaches 0.4 at 20 s: speed-up 0.5
    write_run(tmp_path / "grpo" / "seed-1", [(0, 0.1), (10, 0.4), (20, 0.3)])
    write_run(tmp_path / "pods" / "seed-1", [(0, 0.1), (20, 0.45)])
    # grpo-ga never reaches GRPO's peak in seed 0
    write_run(tmp_path / "grpo-ga" / "seed-0", [(0, 0.2), (50, 0.5)])
    write_run(tmp_path / "grpo-ga" / "seed-1", [(0, 0.1), (50, 0.4)])
    # a method run on seed 1 alone is timed against GRPO's seed 1 (peak 0.4 at 10 s): it reaches
    # 0.4 at 5 s (2x); against the two-seed peak, 0.45, it would count 8 s (1.25x)
    write_run(tmp_path / "pods-part" / "seed-1", [(0, 0.1), (5, 0.42), (8, 0.5)])
    s = summarise(tmp_path, ["grpo", "pods", "grpo-ga", "pods-part"], 2)
    part = s["methods"]["pods-part"]
    assert part["grpo_peak_accuracy_same_seeds"] == pytest.approx(0.4)
    assert part["time_to_grpo_peak_s"] == 5 and part["speedup_vs_grpo"] == pytest.approx(2.0)
    assert s["methods"]["pods"]["grpo_peak_accuracy_same_seeds"] == pytest.approx(0.45)
    pods, grpo, ga = s["methods"]["pods"], s["methods"]["grpo"], s["methods"]["grpo-ga"]
    # per seed, against the same seed's GRPO
    assert [p["speedup_vs_grpo"] for p in pods["per_seed"]] == [4.0, 0.5]
    assert [p["time_to_grpo_peak_s"] for p in ga["per_seed"]] == [None, 50]
    assert pods["spread"]["speedup_vs_grpo_per_seed_mean"] == pytest.approx(2.25)
    assert ga["seeds_reaching_grpo_peak"] == 1 and ga["spread"]["speedup_vs_grpo_per_seed_mean"] is None
    # seed-mean curves: GRPO (up to 20 s, its shorter seed) is 0.15, 0.45, 0.45 at 0, 10, 20 s,
    # so its peak is 0.45, first at 10 s. PODS (up to 10 s) is 0.15, 0.35, 0.40: never 0.45.
    # GRPO-GA is 0.15 then 0.45 at 50 s: speed-up 10 / 50.
    assert s["grpo_peak_accuracy"] == pytest.approx(0.45) and s["grpo_time_to_peak_s"] == 10
    assert grpo["time_to_grpo_peak_s"] == 10 and grpo["speedup_vs_grpo"] == 1.0
    assert pods["time_to_grpo_peak_s"] is None and pods["speedup_vs_grpo"] is None
    assert ga["time_to_grpo_peak_s"] == 50 and ga["speedup_vs_grpo"] == pytest.approx(0.2)
    assert pods["peak_accuracy"] == pytest.approx((0.7 + 0.45) / 2)
    assert grpo["per_seed"][0]["generation_s_per_step"] == 1.5 and grpo["per_seed"][0]["update_peak_memory_mb"] == 120
    assert grpo["per_seed"][0]["scoring_s_per_step"] == pytest.approx(0.15) and grpo["scoring_s_per_step"] == pytest.approx(0.15)
    write_reports(tmp_path, s)
    table = (tmp_path / "summary.md").read_text()
    assert "| pods | 0.575" in table and "| grpo-ga |" in table and "| 4.00, 0.50 |" in table
    assert "pods-part (seeds 1: GRPO's peak 0.400)" in table
    assert "| score s/step |" in table and "| 20.0 | 1.5 | 0.15 | 4.0 | 120 |" in table
    assert (tmp_path / "accuracy_vs_time.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["methods"]["grpo-ga"]["speedup_vs_grpo"] == pytest.approx(0.2)


def curve(*points):
    return [{"train_seconds": t, "eval_accuracy": a} for t, a in points]


def test_bootstrap_interval_of_the_speedup():
    grpo = curve((0, 0.2), (10, 0.5), (20, 0.6))
    fast = curve((0, 0.2), (5, 0.6))  # reaches GRPO's 0.6 at 5 s: 4x
    never = curve((0, 0.2), (30, 0.3))
    # identical seeds: every resample gives the headline
    assert bootstrap_speedup([grpo] * 3, [fast] * 3) == (4.0, 4.0)
    # one seed reaches GRPO's peak, the other never: a resample of the first seed twice (1 in 4)
    # gives 4x, any other mean curve stays below 0.6 (speed-up 0)
    low, high = bootstrap_speedup([grpo, grpo], [fast, never])
    assert (low, high) == (0.0, 4.0)
    assert bootstrap_speedup([grpo], [fast]) is None


def test_methods_parse():
    base = load_config(None, ["n=32", "m=8"])
    methods = parse_methods(["grpo,pods", "grpo-ga", "pods-random:rule=random,n=16"], base)
    assert methods == {"grpo": ["mode=grpo", "n=8"], "pods": ["mode=pods"], "grpo-ga": ["mode=grpo-ga"],
                       "pods-random": ["mode=pods", "rule=random", "n=16"]}
    with pytest.raises(PodsError, match="grpo"):
        parse_methods(["pods"], base)


def test_compare_runs_resumes_and_extends(tiny_model_dir, tmp_path):
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]"]
    out = tmp_path / "cmp"
    first = run_all(None, args, ["grpo,pods"], 1, 0.001, out, 0.2)  # stops after one step
    steps_before = first["methods"]["pods"]["per_seed"][0]["steps"]
    again = run_all(None, args, ["grpo,pods"], 1, 0.001, out, 0.2)  # finished: nothing retrained
    assert again["methods"]["pods"]["per_seed"][0]["steps"] == steps_before
    spent = max(first["methods"][m]["per_seed"][0]["train_seconds"] for m in ("grpo", "pods"))
    longer = run_all(None, args, ["grpo,pods"], 1, 4 * spent / 60, out, 0.2)  # extended from the checkpoint
    rows = [json.loads(l) for l in (out / "pods" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert longer["methods"]["pods"]["per_seed"][0]["steps"] > steps_before
    assert [r["step"] for r in rows if r["step"] == 0] == [0]  # the base evaluation was not redone
    # committed results keep their metrics but not their checkpoints: still done, not retrained
    metrics = (out / "pods" / "seed-0" / "metrics.jsonl").read_text()
    for run in ("grpo", "pods"):
        shutil.rmtree(out / run / "seed-0" / "checkpoints")
    run_all(None, args, ["grpo,pods"], 1, 4 * spent / 60, out, 0.2)
    assert (out / "pods" / "seed-0" / "metrics.jsonl").read_text() == metrics
    assert not (out / "pods" / "seed-0" / "checkpoints").exists()
