"""``podsrl plan``: the least-squares fit against hand-worked values, the trained-rollout estimate
against its closed form, and the command end to end (table, JSON, break-even) with a tiny budget."""

import json
import math
import re

import numpy as np
import pytest
import torch

from conftest import last_wins
from podsrl import plan
from podsrl.cli import main
from podsrl.config import load_config


def test_least_squares_matches_the_hand_worked_line():
    """y = a + b x through (16, 2), (32, 3.5), (64, 5): x mean 112/3, y mean 3.5,
    Sxx = 3584/3, Sxy = 72, so b = 72 / (3584/3) = 27/448 and a = 3.5 - b * 112/3 = 1.25."""
    a, b = plan.least_squares([[1, 16], [1, 32], [1, 64]], [2.0, 3.5, 5.0])
    assert a == pytest.approx(1.25) and b == pytest.approx(27 / 448)


def test_generation_fit_separates_per_call_from_per_rollout_cost():
    """Times made exactly of 0.5 s per engine call and 10 ms per rollout, at call counts the HF
    engine's batching gives, are recovered; with noise, one call per step reproduces the mean."""
    P, batch = 4, 128
    points = [{"calls": plan.engine_calls(P, n, batch), "rows": P * n} for n in (8, 32, 64, 128)]
    assert [p["calls"] for p in points] == [1, 1, 2, 4]  # 128 // 64 = 2 prompts a call; 128 // 128 = 1
    for p in points:
        p["seconds"] = 0.5 * p["calls"] + 0.01 * p["rows"]
    updates = [{"rows": r, "seconds": 2.0 + 0.4 * r, "peak_mb": 1000.0 + 3.0 * r} for r in (8, 16, 32)]
    model = plan.fit(points, updates, scoring_s=0.64, scored=640, prompts=P, batch_size=batch)
    assert (model.per_call_s, model.per_rollout_s) == (pytest.approx(0.5), pytest.approx(0.01))
    assert (model.update_fixed_s, model.update_per_rollout_s) == (pytest.approx(2.0), pytest.approx(0.4))
    assert (model.memory_fixed_mb, model.memory_per_rollout_mb) == (pytest.approx(1000.0), pytest.approx(3.0))
    assert model.scoring_per_rollout_s == pytest.approx(0.001)
    step = model.step(n=64, trained=10.0, micro_batch=32)
    assert step["generation_s"] == pytest.approx(0.5 * 2 + 0.01 * 256)
    assert step["update_s"] == pytest.approx(2.0 + 0.4 * 10) and step["update_peak_mb"] == pytest.approx(1000 + 3 * 32)
    assert step["step_s"] == pytest.approx(step["generation_s"] + 0.256 + step["update_s"])

    noisy = [{"calls": 1, "rows": r, "seconds": s} for r, s in ((16, 1.3), (16, 1.1), (64, 2.9), (64, 3.4), (32, 1.7))]
    model = plan.fit(noisy, updates, 0.0, 1, P, None)
    fitted = [model.per_call_s + model.per_rollout_s * p["rows"] for p in noisy]
    assert sum(fitted) / len(fitted) == pytest.approx(sum(p["seconds"] for p in noisy) / len(noisy))


def test_engine_calls():
    assert plan.engine_calls(4, 256, 128) == 4  # one prompt a call at least
    assert plan.engine_calls(16, 64, 1024) == 1 and plan.engine_calls(16, 128, 1024) == 2
    assert plan.engine_calls(16, 128, None) == 1


@pytest.mark.parametrize("mode,n,m", [("grpo", 8, 8), ("pods", 16, 4), ("grpo-ga", 16, 4)])
def test_trained_rollouts_against_the_closed_form(monkeypatch, mode, n, m):
    """One prompt a step, its group drawn from rewards with k = 3 of N = 8 correct: the group is
    mixed with probability q = 1 - p^n - (1 - p)^n (p = 3/8); then every selected rollout has a
    non-zero advantage (0/1 rewards; max-variance takes both values), else none does and the
    trainer keeps one. Expected trained rollouts: q * T + (1 - q) * 1, T the selected count."""
    monkeypatch.setattr(plan, "SIGNAL_DRAWS", 40_000)
    c = load_config(None, [f"mode={mode}", f"n={n}", "prompts_per_step=1"] + ([] if mode == "grpo" else [f"m={m}"]))
    groups = torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]])
    p = 3 / 8
    q = 1 - p**n - (1 - p) ** n
    T = m if mode == "pods" else n
    got = plan.trained_rollouts(c, groups, torch.Generator().manual_seed(0))
    assert got == pytest.approx(q * T + (1 - q), abs=0.05)
    # all-equal groups train nothing (one kept a step); without skip_zero_advantage every selected one
    assert plan.trained_rollouts(c, torch.zeros(3, 8), torch.Generator().manual_seed(0)) == 1.0
    c_all = load_config(None, [f"mode={mode}", f"n={n}", "prompts_per_step=1", "skip_zero_advantage=false"]
                        + ([] if mode == "grpo" else [f"m={m}"]))
    assert plan.trained_rollouts(c_all, torch.zeros(3, 8), torch.Generator()) == float(T)


def test_verdicts_say_where_pods_cannot_pay():
    rows = [{"method": "grpo", "n": 8, "m": 8, "step_s": 7.6},
            {"method": "pods", "n": 32, "m": 8, "step_s": 15.2, "break_even_vs_grpo": 0.6, "break_even_vs_grpo_ga": 2.3},
            {"method": "pods", "n": 64, "m": 8, "step_s": 25.0, "break_even_vs_grpo": 0.304, "break_even_vs_grpo_ga": 0.8}]
    lines = plan.verdicts(rows)
    assert lines[0].startswith("PODS (n = 32, m = 8) can pay against GRPO (n = 8): it wins on time if it needs fewer "
                               "than 0.60x GRPO's optimizer steps")
    assert lines[1].startswith("PODS (n = 32, m = 8) can pay against GRPO-GA (n = 32)")
    assert lines[2].startswith("PODS (n = 64, m = 8) cannot pay against GRPO (n = 8) here: it wins on time only if it "
                               "needs fewer than 0.30x GRPO's optimizer steps; it needed 0.40x [0.33-0.78] on the task measured")
    assert lines[3].startswith("PODS (n = 64, m = 8) cannot pay against GRPO-GA (n = 64) here")


def run_plan(capsys, overrides, *flags):
    code = main(["plan", *last_wins(overrides), *flags])
    return code, capsys.readouterr()


def check_report(report: dict, out: str, prompts: int) -> None:
    """The JSON's structure, its fit against its own measured points, and each break-even as
    the ratio of step times recomputed here from the fitted coefficients."""
    f = report["fit"]
    gen = report["measured"]["generation"]
    assert all(p["calls"] == 1 for p in gen)  # the tiny sizes take one engine call each
    fitted = [f["per_call_s"] * p["calls"] + f["per_rollout_s"] * p["rows"] for p in gen]
    assert sum(fitted) / len(fitted) == pytest.approx(sum(p["seconds"] for p in gen) / len(gen), rel=1e-6, abs=1e-9)
    upd = report["measured"]["updates"]
    fitted = [f["update_fixed_s"] + f["update_per_rollout_s"] * p["rows"] for p in upd]
    assert sum(fitted) / len(fitted) == pytest.approx(sum(p["seconds"] for p in upd) / len(upd), rel=1e-6, abs=1e-9)
    assert report["measured"]["mean_completion_length"] > 0

    def step_s(row):
        rows = prompts * row["n"]
        return (f["per_call_s"] * plan.engine_calls(prompts, row["n"], f["batch_size"]) + f["per_rollout_s"] * rows
                + f["scoring_per_rollout_s"] * rows + f["update_fixed_s"] + f["update_per_rollout_s"] * row["trained"])

    settings = report["settings"]
    grpo = settings[0]
    assert grpo["method"] == "grpo" and grpo["n"] == grpo["m"] == report["m"]
    pods = [r for r in settings if r["method"] == "pods"]
    assert [r["n"] for r in pods] == report["sizes"]["candidates"]
    for r in settings:
        assert r["step_s"] == pytest.approx(step_s(r))
        assert r["step_s"] == pytest.approx(r["generation_s"] + r["scoring_s"] + r["update_s"])
    for r in pods:
        ga = next(g for g in settings if g["method"] == "grpo-ga" and g["n"] == r["n"])
        assert r["break_even_vs_grpo"] == pytest.approx(step_s(grpo) / step_s(r))
        assert r["break_even_vs_grpo_ga"] == pytest.approx(step_s(ga) / step_s(r))
        assert r["trained"] <= prompts * r["m"] and ga["trained"] <= prompts * r["n"]
        assert f"| pods | {r['n']} | {r['m']} | {prompts * r['n']} |" in out
    assert len(report["verdicts"]) == 2 * len(pods)
    assert all(v in out for v in report["verdicts"])
    assert "measured on one task and model, not a law" in out and "0.40x" in out


def test_plan_end_to_end_on_a_tiny_model(capsys, tmp_path, tiny_overrides):
    out = tmp_path / "plan.json"
    code, io = run_plan(capsys, tiny_overrides + ["threads=1"], "--generate", "2,4", "--calls", "2", "--update", "2,4",
                        "--candidates", "4,6", "--json", str(out))
    assert code == 0, io.err
    report = json.loads(out.read_text())
    assert report["sizes"] == {"generate": [2, 4], "calls": 2, "update": [2, 4], "candidates": [4, 6]}
    measured = report["measured"]["generation"] + report["measured"]["updates"]
    assert report["clock"] == "wall" and all(p["seconds"] == p["wall_s"] for p in measured)
    assert len(report["measured"]["generation"]) == 4
    # the updates at 2 and 4 per prompt, then a step whose advantages are all 0: one row trains
    assert [(p["m"], p["rows"]) for p in report["measured"]["updates"]] == [(2, 4), (4, 8), (None, 1)]
    check_report(report, io.out, prompts=2)
    assert not (tmp_path / "run").exists()  # plan writes no run folder
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_signal_all_trains_every_selected_rollout_and_cpu_clock_times_cpu_seconds(capsys, tmp_path, tiny_overrides):
    out = tmp_path / "plan.json"
    code, io = run_plan(capsys, tiny_overrides + ["threads=1", "clock=cpu"], "--generate", "2,4", "--calls", "1",
                        "--update", "2,4", "--candidates", "4", "--signal", "all", "--json", str(out))
    assert code == 0, io.err
    report = json.loads(out.read_text())
    assert [(r["method"], r["trained"]) for r in report["settings"]] == [("grpo", 4), ("pods", 4), ("grpo-ga", 8)]
    measured = report["measured"]["generation"] + report["measured"]["updates"]
    assert report["clock"] == "cpu" and all(p["seconds"] == p["cpu_s"] for p in measured)
    assert report["fit"]["scoring_per_rollout_s"] == 0.0 and "clock=cpu: this process's CPU seconds" in io.out
    check_report(report, io.out, prompts=2)


def test_plan_alternates_generation_and_updates_as_a_run_does(capsys, tmp_path, tiny_overrides, monkeypatch):
    """Each measured update follows a generate call (as in a run's steps, not all after the
    generation); with a KL term no rollout is skipped, so there is no zero-signal update."""
    from podsrl import sampling, trainer

    calls = []
    step_groups, update = sampling.Sampler.step_groups, trainer.update
    monkeypatch.setattr(sampling.Sampler, "step_groups", lambda self, *a: calls.append("G") or step_groups(self, *a))
    monkeypatch.setattr(trainer, "update", lambda *a, **k: calls.append("U") or update(*a, **k))
    code, io = run_plan(capsys, tiny_overrides + ["threads=1"], "--generate", "2,4", "--calls", "2", "--update", "2,4",
                        "--candidates", "4")
    assert code == 0, io.err
    # warm-up call; 4 measured calls, largest n first, each followed by an update (warm-up, 2, 4, zero-signal)
    assert "".join(calls) == "G" + "GU" * 4
    calls.clear()
    out = tmp_path / "beta.json"
    code, io = run_plan(capsys, tiny_overrides + ["threads=1", "beta=0.04"], "--generate", "2,4", "--calls", "2",
                        "--update", "2,4", "--candidates", "4", "--json", str(out))
    assert code == 0, io.err
    assert "".join(calls) == "G" + "GU" * 3 + "G"
    assert [p["m"] for p in json.loads(out.read_text())["measured"]["updates"]] == [2, 4]


def test_plan_forks_the_reward_workers_before_the_model_loads(capsys, tiny_overrides, monkeypatch,
                                                              children_at_model_load):
    """As the trainer does: the worker that scores plan's generate calls was alive when the model
    loaded, so it keeps no stale copy of the weights that plan's updates rewrite."""
    from podsrl import sampling

    alive, scorers = children_at_model_load, set()
    step_groups = sampling.Sampler.step_groups

    def scored(self, *args):
        groups = step_groups(self, *args)
        scorers.update(int(r) for r in groups.rewards.flatten().tolist())
        return groups

    monkeypatch.setattr(sampling.Sampler, "step_groups", scored)
    code, io = run_plan(capsys, tiny_overrides + ["threads=1", "reward_workers=1", "rewards=[rewards_for_tests:scored_by]"],
                        "--generate", "2,4", "--calls", "1", "--update", "2,4", "--candidates", "4")
    assert code == 0, io.err
    assert len(alive) == 1 and len(scorers) == 1 and scorers <= alive[0]


# --------------------------------------------------------------------------- an earlier run's signal


@pytest.mark.parametrize("n", [1, 2, 8, 32])
def test_mixed_share_against_hand_worked_values(n):
    """Uniform success rates (mean 1/2, concentration 2): E[p^n] = 1/(n+1), so the share is
    1 - 2/(n+1). Concentration to infinity: every prompt has the mean, 1 - p^n - (1-p)^n. A mean of
    0 or 1 never mixes."""
    assert plan.mixed_share(0.5, 2.0, n) == pytest.approx(1 - 2 / (n + 1))
    assert plan.mixed_share(0.3, 1e9, n) == pytest.approx(1 - 0.3**n - 0.7**n, abs=1e-6)
    assert plan.mixed_share(0.0, 0.7, n) == plan.mixed_share(1.0, 0.7, n) == 0.0


def test_mixed_share_against_monte_carlo():
    rng = np.random.default_rng(0)
    p = rng.beta(0.2 * 0.6, 0.8 * 0.6, 400_000)
    k = rng.binomial(8, p)
    assert plan.mixed_share(0.2, 0.6, 8) == pytest.approx(float(((k > 0) & (k < 8)).mean()), abs=0.003)


@pytest.mark.slow
def test_concentration_fit_recovers_the_simulated_spread():
    """Steps whose mixed counts are drawn as the model says, at known concentrations: the fit
    lands within 25% of each (the grid is 5% apart)."""
    rng = np.random.default_rng(1)
    for true in (0.3, 3.0):
        means = rng.uniform(0.05, 0.6, 3000)
        mixed = [int(rng.binomial(4, plan.mixed_share(m, true, 8))) for m in means]
        assert plan.fit_concentration(list(means), mixed, 4, 8) == pytest.approx(true, rel=0.25)


@pytest.mark.parametrize("mode,n,m", [("grpo", 8, 8), ("pods", 32, 8), ("grpo-ga", 32, 8)])
def test_trained_over_runs_against_the_closed_form(mode, n, m):
    """At a step of mean reward mu, a group of n is mixed with probability q = mixed_share(mu, k, n);
    a mixed group trains all it selects (0/1 rewards; max-variance takes both values), T = m or n;
    a step with no mixed group trains the one row the trainer keeps. Per step:
    P * T * q + (1 - q)^P."""
    P, k = 4, 0.7
    signal = plan.Signal(["x"], 8, P, [0.1, 0.3], [0, 0], k)
    c = load_config(None, [f"mode={mode}", f"n={n}", f"m={m}", f"prompts_per_step={P}"])
    T = n if mode == "grpo-ga" else m
    want = sum(P * T * q + (1 - q) ** P for q in (plan.mixed_share(mu, k, n) for mu in signal.means)) / 2
    got = plan.trained_over_runs(c, signal, np.random.default_rng(0), draws=20_000)
    assert got == pytest.approx(want, rel=0.02)


def write_run(folder, steps, n=8, prompts=2, mode="grpo", rule="max_variance", **settings):
    """A finished run's folder: config.yaml and metrics.jsonl with each step's (mean, mixed
    groups) and the reward std that 0/1 values of that mean have."""
    import yaml

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"mode": mode, "n": n, "m": n if mode == "grpo" else 4,
                                                         "rule": rule, "prompts_per_step": prompts, "steps": len(steps),
                                                         **settings}))
    rows = [{"step": 0, "eval_accuracy": 0.1}]
    for i, (mean, mixed) in enumerate(steps, 1):
        N = prompts * n
        rows.append({"step": i, "generated_reward_mean": mean, "generated_reward_std": (N * mean * (1 - mean) / (N - 1)) ** 0.5,
                     "rollouts_generated": N, "frac_zero_std_groups": 1 - mixed / prompts})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_read_signal_takes_each_step_and_refuses_what_the_model_does_not_fit(tmp_path):
    a = write_run(tmp_path / "a", [(0.125, 1), (0.25, 2)])
    b = write_run(tmp_path / "b", [(0.0, 0)])
    s = plan.read_signal([a, b])
    assert (s.n, s.prompts, s.means, s.mixed) == (8, 2, [0.125, 0.25, 0.0], [1, 2, 0])
    assert s.concentration == pytest.approx(plan.fit_concentration([0.125, 0.25, 0.0], [1, 2, 0], 2, 8))
    bad = write_run(tmp_path / "bad", [(0.5, 1)])
    text = (bad / "metrics.jsonl").read_text().replace('"generated_reward_std": 0.5', '"generated_reward_std": 0.1')
    (bad / "metrics.jsonl").write_text(text)
    with pytest.raises(plan.PodsError, match="step 1's rewards are not 0/1"):
        plan.read_signal([bad])
    with pytest.raises(plan.PodsError, match="rule max_variance, not random"):
        plan.read_signal([write_run(tmp_path / "r", [(0.5, 1)], mode="pods", n=16, rule="random")])
    with pytest.raises(plan.PodsError, match="one n and prompts_per_step"):
        plan.read_signal([a, write_run(tmp_path / "c", [(0.5, 1)], n=16)])
    with pytest.raises(plan.PodsError, match="not a run's folder"):
        plan.read_signal([tmp_path / "missing"])
    odd = write_run(tmp_path / "odd", [(0.5, 1)])
    (odd / "metrics.jsonl").write_text('{"step": 1, "frac_zero_std_groups": 0.5}\n')
    with pytest.raises(plan.PodsError, match="not a podsrl run's config.yaml and metrics.jsonl"):
        plan.read_signal([odd])


@pytest.mark.parametrize("field,value,message", [
    ("generated_reward_mean", "NaN", "step 1 logged generated_reward_mean nan"),
    ("generated_reward_std", "Infinity", "generated_reward_std inf"),
    ("frac_zero_std_groups", "NaN", "frac_zero_std_groups nan (a share, 0 to 1)"),
    ("frac_zero_std_groups", "1.5", "frac_zero_std_groups 1.5 (a share, 0 to 1)"),
    ("frac_zero_std_groups", "-0.5", "frac_zero_std_groups -0.5"),
    ("rollouts_generated", "Infinity", "not a podsrl run's config.yaml and metrics.jsonl (OverflowError"),
])
def test_read_signal_refuses_numbers_out_of_range_in_one_line(tmp_path, field, value, message):
    run = write_run(tmp_path / "run", [(0.5, 1)])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[1][field] = "VALUE"
    (run / "metrics.jsonl").write_text("".join(json.dumps(r).replace('"VALUE"', value) + "\n" for r in rows))
    with pytest.raises(plan.PodsError, match=re.escape(message)):
        plan.read_signal([run])


@pytest.mark.parametrize("text", ["", "[1, 2]\n"])
def test_read_signal_says_a_config_without_settings_is_one(tmp_path, text):
    run = write_run(tmp_path / "run", [(0.5, 1)])
    (run / "config.yaml").write_text(text)
    with pytest.raises(plan.PodsError, match="its config.yaml holds no settings"):
        plan.read_signal([run])


def test_read_signal_refuses_runs_of_another_task_or_reward(tmp_path):
    run = write_run(tmp_path / "run", [(0.5, 1)])
    assert plan.read_signal([run], load_config(None, ["n=8", "prompts_per_step=2"])).n == 8  # defaults: the same task
    with pytest.raises(plan.PodsError, match=re.escape("a run of another task or reward (task.digits: 1, here 3)")):
        plan.read_signal([run], load_config(None, ["task.digits=3"]))
    with pytest.raises(plan.PodsError, match=re.escape("(rewards: ['accuracy'], here ['accuracy', 'format'])")):
        plan.read_signal([run], load_config(None, ["rewards=[accuracy,format]", "reward_weights=[1,1]"]))


def test_signal_from_sets_the_trained_rollouts_end_to_end(capsys, tmp_path, tiny_overrides):
    """The plan's rows train what the earlier runs' signal gives (recomputed here with the same
    seed); bad input is one line and exit 2."""
    earlier = write_run(tmp_path / "earlier", [(0.25, 1), (0.5, 2), (0.75, 1)], n=4, prompts=2,
                        rewards=["rewards_for_tests:varied"])
    out = tmp_path / "plan.json"
    code, io = run_plan(capsys, tiny_overrides + ["threads=1"], "--generate", "2,4", "--calls", "1", "--update", "2,4",
                        "--candidates", "4", "--signal-from", str(earlier), "--json", str(out))
    assert code == 0, io.err
    report = json.loads(out.read_text())
    assert report["signal"] == "runs" and report["signal_from"]["steps"] == 3
    assert "over the reward signal of 1 earlier run(s)" in io.out
    signal, rng = plan.read_signal([earlier]), np.random.default_rng(report["config"]["seed"])
    c = load_config(None, last_wins(tiny_overrides + ["threads=1"]))
    for row in report["settings"]:
        assert row["trained"] == pytest.approx(plan.trained_over_runs(plan.method_config(c, row["method"], row["n"]), signal, rng))
        assert "trained_at_start" in row
    check_report(report, io.out, prompts=2)
    for flags, message in (
        (["--signal-from", str(tmp_path / "nowhere")], "not a run's folder"),
        (["--signal-from", str(earlier), "--signal", "all"], "give one of them"),
        (["--signal-from", str(write_run(tmp_path / "p3", [(0.5, 1)], prompts=3, rewards=["rewards_for_tests:varied"]))],
         "took 3 prompts a step"),
        (["--signal-from", str(write_run(tmp_path / "acc", [(0.5, 1)], n=4))], "a run of another task or reward"),
    ):
        code, io = run_plan(capsys, tiny_overrides, *flags)
        assert code == 2 and io.err.count("\n") == 1 and message in io.err, io.err


@pytest.mark.slow
def test_plan_on_the_embedded_default_with_the_smallest_sizes(capsys, tmp_path):
    """The embedded model and task as ``podsrl train`` runs them, with the fewest calls."""
    out = tmp_path / "plan.json"
    code, io = run_plan(capsys, ["prompts_per_step=2", "threads=1", "rollout.max_new_tokens=6"], "--generate", "2,4",
                        "--calls", "1", "--update", "2,4", "--json", str(out))
    assert code == 0, io.err
    report = json.loads(out.read_text())
    assert report["model"] == "smollm2" and report["m"] == 4 and report["sizes"]["candidates"] == [8, 16, 32]
    assert math.isfinite(report["seconds"])
    check_report(report, io.out, prompts=2)


# --------------------------------------------------------------------------- async_lag


def test_an_overlapped_step_is_the_longer_side_plus_its_weight_sync():
    """Hand-worked, with the costs of the fit test above (n = 64, 10 trained, 4 prompts): the
    worker's side is load 0.05 + generation 3.56 + scoring 0.256 = 3.866 s; the trainer's, update
    6.0 + publish 0.1 = 6.1 s: the step is 6.1 s. With a cheaper update, 1.0 + 0.1 x 10 = 2.0 s, it
    is the worker's 3.866 s."""
    common = dict(per_call_s=0.5, per_rollout_s=0.01, scoring_per_rollout_s=0.001, memory_fixed_mb=None,
                  memory_per_rollout_mb=None, prompts=4, batch_size=128, overlapped=True, publish_s=0.1, load_s=0.05)
    slow_update = plan.CostModel(update_fixed_s=2.0, update_per_rollout_s=0.4, **common)
    assert slow_update.step(64, 10.0, 32)["step_s"] == pytest.approx(6.1)
    fast_update = plan.CostModel(update_fixed_s=1.0, update_per_rollout_s=0.1, **common)
    step = fast_update.step(64, 10.0, 32)
    assert step["step_s"] == pytest.approx(0.05 + 3.56 + 0.256)
    assert step["generation_s"] == pytest.approx(3.56) and step["update_s"] == pytest.approx(2.0)


def test_plan_under_a_lag_measures_generation_at_the_workers_threads_and_the_update_at_the_trainers(
        capsys, tmp_path, tiny_overrides, monkeypatch):
    from podsrl import sampling, trainer

    seen = []
    step_groups, update = sampling.Sampler.step_groups, trainer.update
    monkeypatch.setattr(sampling.Sampler, "step_groups",
                        lambda self, *a: seen.append(("G", torch.get_num_threads(), self.engine.record_logp))
                        or step_groups(self, *a))
    monkeypatch.setattr(trainer, "update", lambda *a, **k: seen.append(("U", torch.get_num_threads(), None)) or update(*a, **k))
    out = tmp_path / "plan.json"
    before = torch.get_num_threads()
    try:
        code, io = run_plan(capsys, tiny_overrides + ["async_lag=1", "threads=2", "async_worker_threads=1"],
                            "--generate", "2,4", "--calls", "1", "--update", "2,4", "--candidates", "4", "--json", str(out))
    finally:
        torch.set_num_threads(before)
    assert code == 0, io.err
    assert {t for kind, t, _ in seen if kind == "G"} == {1} and {t for kind, t, _ in seen if kind == "U"} == {2}
    assert all(logp for kind, _, logp in seen if kind == "G")  # the worker's engine records its log-probs
    report = json.loads(out.read_text())
    f = report["fit"]
    assert report["async_lag"] == 1 and report["worker_threads"] == 1 and report["threads"] == 2
    assert f["overlapped"] and f["publish_s"] > 0 and f["load_s"] > 0
    for row in report["settings"]:  # the mean over steps of the longer side: at least the longer mean side, at most both
        worker, trainer = f["load_s"] + row["generation_s"] + row["scoring_s"], row["update_s"] + f["publish_s"]
        assert max(worker, trainer) - 1e-9 <= row["step_s"] <= worker + trainer
    assert "async_lag=1: generation at the worker's 1 thread(s), the update at the trainer's 2" in io.out


def simulated_mean_step(worker_s: float, updates: list[float], lag: int = 1) -> float:
    """The fixed-lag pipeline as events, independently of the cost model: step t's rollouts are
    generated, one step after another, once the worker has finished the previous step and update
    max(0, t - 1 - lag) has ended; update t starts once its rollouts are ready and update t - 1 has
    ended. The mean step over the second half of the run (past its start)."""
    ready, end = {}, {0: 0.0}  # end[v]: when update v (version v's weights) ended
    worker_free = 0.0
    for t in range(1, len(updates) + 1):
        start = max(worker_free, end[max(0, t - 1 - lag)])
        ready[t] = worker_free = start + worker_s
        end[t] = max(ready[t], end[t - 1]) + updates[t - 1]
    half = len(updates) // 2
    return (end[len(updates)] - end[half]) / (len(updates) - half)


def test_an_overlapped_step_is_the_mean_of_per_step_maxima_as_the_pipeline_runs():
    """Updates alternating 1.5 s and 6.3 s (1 and 13 trained rollouts at 1.0 + 0.4 s each, plus a
    0.1 s publish) beside a 3.866 s worker side: the mean step is (3.866 + 6.3) / 2 = 5.083 s,
    as an event simulation of the lag-1 pipeline gives, not the 3.9 s of the mean parts' maximum."""
    model = plan.CostModel(per_call_s=0.5, per_rollout_s=0.01, scoring_per_rollout_s=0.001, update_fixed_s=1.0,
                           update_per_rollout_s=0.4, memory_fixed_mb=None, memory_per_rollout_mb=None, prompts=4,
                           batch_size=128, overlapped=True, publish_s=0.1, load_s=0.05)
    step = model.step(64, 7.0, 32, per_step=[1.0, 13.0])
    assert step["step_s"] == pytest.approx((3.866 + 6.3) / 2)
    assert model.step(64, 7.0, 32)["step_s"] == pytest.approx(3.9)  # no spread: every step trains the mean
    assert simulated_mean_step(3.866, [1.5, 6.3] * 200) == pytest.approx(step["step_s"], rel=1e-3)
    rng = np.random.default_rng(0)
    draws = rng.integers(1, 20, 400).astype(float)
    predicted = model.step(64, float(draws.mean()), 32, per_step=list(draws[200:]))["step_s"]  # the half simulated
    simulated = simulated_mean_step(3.866, [1.0 + 0.4 * r + 0.1 for r in draws])
    assert simulated == pytest.approx(predicted, rel=0.01)
