"""The training loop on a tiny model: modes, selection reaching the loss, equivalences, resume."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import podsrl.trainer as trainer
from podsrl.tasks import task_from_config
from podsrl.trainer import train


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run):
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1] / "model"
    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize(
    "mode,trained,micro_batches",
    [("pods", 2 * 2, 1), ("grpo", 2 * 4, 1), ("grpo-ga", 2 * 4, 2)],
)
def test_each_mode_trains_and_logs(tiny_config, mode, trained, micro_batches):
    out = train(tiny_config(f"mode={mode}", *(["m=4"] if mode == "grpo" else [])))  # grpo: m = n
    rows = read_metrics(out)
    assert rows[0]["step"] == 0 and "eval_accuracy" in rows[0]  # base model evaluated first
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["trained_sequences"] == trained and r["micro_batches"] == micro_batches
        for key in ("train_seconds", "generation_s", "update_s", "generated_reward_mean", "selected_reward_std",
                    "generated_completion_length", "selected_completion_length", "update_peak_memory_mb"):
            assert key in r
    assert steps[1]["train_seconds"] > steps[0]["train_seconds"] > 0
    assert "eval_accuracy" in steps[-1]
    assert (out / "config.yaml").exists() and (out / "checkpoints" / "step-000002" / "model").is_dir()
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_metrics_name_the_rollouts_they_average_over(tiny_config):
    """With adaptive_n a prompt takes as many rollouts as it needs: generated_* average over every
    rollout generated (as many as logged to completions.jsonl), selected_* over the trained ones."""
    import json

    out = train(tiny_config("adaptive_n=true", "n=8", "m=2", "adaptive_round=2", "steps=1", "log_completions=1000"))
    row = [r for r in read_metrics(out) if r["step"] == 1][0]
    logged = [json.loads(l) for l in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == row["rollouts_generated"] > 2 * 2
    every = [r["reward"] for r in logged]
    chosen = [r["reward"] for r in logged if r["selected"]]
    assert len(chosen) == 2 * 2
    assert row["generated_reward_mean"] == pytest.approx(sum(every) / len(every))
    assert row["selected_reward_mean"] == pytest.approx(sum(chosen) / len(chosen))
    assert row["generated_completion_length"] > 0 and row["selected_completion_length"] > 0


def test_only_selected_rollouts_reach_the_loss(tiny_config, monkeypatch):
    seen, chosen = [], []
    real_loss, real_down_sample = trainer.policy_loss, trainer.down_sample

    def spy_down_sample(c, rewards, step, sizes=None):
        result = real_down_sample(c, rewards, step, sizes)
        chosen.append((rewards, result))
        return result

    def spy_loss(logp, advantages, mask, **kw):
        seen.append((advantages.detach().clone(), mask.shape[0]))
        return real_loss(logp, advantages, mask, **kw)

    monkeypatch.setattr(trainer, "down_sample", spy_down_sample)
    monkeypatch.setattr(trainer, "policy_loss", spy_loss)
    train(tiny_config("n=6", "m=2", "steps=1"))
    (rewards, result), = chosen
    assert result.rows.numel() == 2 * 2  # P * m of the P * n generated
    # the selected rows are the max-variance pairs of each group, and only they reach the loss
    for p in range(2):
        picked = rewards[p, result.rows[p * 2 : p * 2 + 2] - p * 6]
        assert torch.isclose(picked.var(unbiased=False), max(
            torch.stack([rewards[p, i], rewards[p, j]]).var(unbiased=False)
            for i in range(6) for j in range(i + 1, 6)))
    assert sum(n for _, n in seen) == 4
    assert torch.allclose(torch.cat([a for a, _ in seen]).cpu(), result.advantages.flatten())


def test_pods_with_m_equal_n_matches_grpo(tiny_config, tmp_path):
    a = train(tiny_config("mode=pods", "m=4", f"output_dir={tmp_path / 'pods'}"))
    b = train(tiny_config("mode=grpo", "m=4", f"output_dir={tmp_path / 'grpo'}"))
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # and training moved the weights at all
    start = load_file(Path(tiny_config().model.name_or_path) / "model.safetensors")
    assert any(not torch.equal(wa[k], start[k]) for k in wa)


def test_resume_continues_identically(tiny_config, tmp_path):
    straight = train(tiny_config("steps=4", f"output_dir={tmp_path / 'straight'}"))
    part = train(tiny_config("steps=2", "save_optimizer=true", f"output_dir={tmp_path / 'resumed'}"))
    resumed = train(tiny_config("steps=4", "resume=true", f"output_dir={part}"))
    wa, wb = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ra = [r for r in read_metrics(straight) if r["step"] > 0]
    rb = [r for r in read_metrics(resumed) if r["step"] > 0]
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb):
        assert x["generated_reward_mean"] == y["generated_reward_mean"] and x["loss"] == pytest.approx(y["loss"], abs=1e-7)


def lost_checkpoints(run, last_step: int) -> list[str]:
    """``run`` as an interruption after ``last_step`` leaves it when its checkpoints are lost (a
    new copy of its folder): its metrics lines up to that step, and no checkpoint."""
    import shutil

    from podsrl import rundir

    shutil.rmtree(run / "checkpoints")
    (run / "final_model").exists() and shutil.rmtree(run / "final_model")
    lines = [line for line in (run / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= last_step]
    (run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    (run / rundir.LOCK).touch()
    return lines


def test_replay_trains_the_logged_steps_again_without_evaluating_them(tiny_config, tmp_path, monkeypatch):
    """A run that lost its checkpoint after step 2 of 4 is replayed: steps 1-2 trained again with
    no evaluation (their logged records, evaluations and clock kept as written), steps 3-4
    trained and evaluated on; the result is the uninterrupted run's, weights and records."""
    straight = train(tiny_config("steps=4", "eval_every=2", f"output_dir={tmp_path / 'straight'}"))
    run = train(tiny_config("steps=4", "eval_every=2", f"output_dir={tmp_path / 'lost'}"))
    logged = lost_checkpoints(run, 2)
    evaluated = []
    real = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda *a, **k: evaluated.append(1) or real(*a, **k))
    train(tiny_config("steps=4", "eval_every=2", "replay=true", f"output_dir={run}"))
    assert len(evaluated) == 1  # step 4's alone: step 0's and step 2's stand as logged
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[: len(logged)] == logged and [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3, 4]
    wa, wb = final_weights(straight), final_weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    same = [(x["step"], x.get("loss"), x.get("generated_reward_mean"), x.get("eval_accuracy")) for x in read_metrics(straight)]
    assert same == [(y["step"], y.get("loss"), y.get("generated_reward_mean"), y.get("eval_accuracy")) for y in read_metrics(run)]
    # the clock goes on from the logged one
    assert read_metrics(run)[3]["train_seconds"] > json.loads(logged[2])["train_seconds"]
    assert "replaying steps 1-2" in (run / "podsrl_commit.txt").read_text().splitlines()[-1]


def test_a_replayed_step_that_differs_from_its_record_stops_the_run(tiny_config, tmp_path):
    """A logged record the replay does not reproduce (here: a loss written otherwise, as another
    machine's arithmetic would give) stops the run, naming the step and field, and leaves the
    folder as it was: the records, and no checkpoint."""
    from podsrl.errors import PodsError
    from podsrl.replay import ReplayMismatch

    run = train(tiny_config("steps=3", f"output_dir={tmp_path / 'run'}"))
    lines = lost_checkpoints(run, 2)
    record = json.loads(lines[2])
    record["loss"] += 1e-6
    lines[2] = json.dumps(record)
    (run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    with pytest.raises(ReplayMismatch, match=r"step 2 of .* differs from its record \(loss: logged") as e:
        train(tiny_config("steps=3", "replay=true", f"output_dir={run}"))
    assert isinstance(e.value, PodsError)
    assert (run / "metrics.jsonl").read_text().splitlines() == lines and not (run / "checkpoints").exists()
    # without replay, the run starts again from step 0
    train(tiny_config("steps=3", f"output_dir={run}"))
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]


def test_a_replay_on_recorded_completions_generates_nothing_and_reaches_the_same_weights(tiny_config, tmp_path,
                                                                                         monkeypatch):
    """save_rollouts: the replay of steps 1-2 trains on the completions the run recorded, with no
    generate call of the engine's (the evaluation at step 3 and step 3's rollouts alone generate),
    and ends with the uninterrupted run's weights."""
    from podsrl.rollout.hf import HFEngine

    straight = train(tiny_config("steps=3", f"output_dir={tmp_path / 'straight'}"))
    run = train(tiny_config("steps=3", "save_rollouts=true", f"output_dir={tmp_path / 'lost'}"))
    assert (run / "rollouts.jsonl").stat().st_size > 0
    lost_checkpoints(run, 2)
    calls = []
    real = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, prompts, *a, **k: calls.append(len(prompts)) or
                        real(self, prompts, *a, **k))
    train(tiny_config("steps=3", "save_rollouts=true", "replay=true", f"output_dir={run}"))
    assert calls == [2, 4]  # step 3's two prompts, then the 4 held-out problems
    wa, wb = final_weights(straight), final_weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_replay_on_recorded_completions_allows_rounding_and_no_more(tiny_config, tmp_path):
    """Replayed on its recorded completions, a step's gradient norm may differ from its record by another
    machine's rounding (here: the record moved by 1e-6 of itself), not by a different computation
    (a recorded token changed: its reward or length no longer matches)."""
    from podsrl.replay import ReplayMismatch

    run = train(tiny_config("steps=2", "save_rollouts=true",
                            f"output_dir={tmp_path / 'run'}"))
    lines = lost_checkpoints(run, 2)
    record = json.loads(lines[2])
    assert record["grad_norm"] > 0
    record["grad_norm"] *= 1 + 1e-6
    (run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in [*lines[:2], json.dumps(record)]))
    kept = (run / "rollouts.jsonl").read_text()
    train(tiny_config("steps=2", "save_rollouts=true", "replay=true",
                      f"output_dir={run}"))
    lines = lost_checkpoints(run, 2)
    calls = [json.loads(line) for line in kept.splitlines()]
    calls[0]["ids"][0] = calls[0]["ids"][0][:-1] or [0, 0]  # one completion a token shorter (or longer)
    (run / "rollouts.jsonl").write_text("".join(json.dumps(call) + "\n" for call in calls))
    with pytest.raises(ReplayMismatch, match="step 1 of .* differs from its record"):
        train(tiny_config("steps=2", "save_rollouts=true", "replay=true",
                          f"output_dir={run}"))


def test_a_rollout_log_cut_short_keeps_its_whole_calls_and_a_broken_line_names_itself(tmp_path):
    """rollouts.jsonl as metrics.jsonl: a last line a killed write left without its newline is
    dropped; a broken line before it is an error naming the file and line, not a traceback."""
    from podsrl.errors import PodsError
    from podsrl.rollout.recorded import read_rows

    call = {"keys": [["ab", 3, 0], ["ab", 3, 1]], "ids": [[5, 2], [7]], "width": 2, "prompt_width": 4}
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(call) + "\n" + json.dumps(call | {"keys": [["cd", 3, 0]]})[:30])
    rows = read_rows(path)
    assert list(rows) == [("ab", 3, 0), ("ab", 3, 1)] and rows[("ab", 3, 1)]["ids"] == [7]
    assert rows[("ab", 3, 0)]["logp"] is None and rows[("ab", 3, 0)]["width"] == 2
    path.write_text('{"keys": [["ab"\n' + json.dumps(call) + "\n")
    with pytest.raises(PodsError, match=r"rollouts.jsonl:1: not a podsrl rollout log record"):
        read_rows(path)
    path.write_text(json.dumps({"ids": [[1]]}) + "\n")
    with pytest.raises(PodsError, match=r"rollouts.jsonl:1: not a podsrl rollout log record \(no keys\)"):
        read_rows(path)


@pytest.mark.parametrize("setting", ["replay", "save_rollouts"])
def test_replay_and_save_rollouts_under_several_processes_are_refused_before_anything_is_written(tiny_config, tmp_path,
                                                                                                  setting):
    from types import SimpleNamespace

    from podsrl.errors import PodsError
    from podsrl.trainer import setup

    launched = SimpleNamespace(num_processes=2, is_main_process=True)  # what accelerate launch with two processes gives
    with pytest.raises(PodsError, match=f"{setting}=true runs on one process \\(2 were launched\\)"):
        setup(tiny_config(f"{setting}=true", "prompts_per_step=2", f"output_dir={tmp_path / 'run'}"), launched)
    assert not (tmp_path / "run").exists()


def test_the_reward_workers_are_forked_before_the_model_loads(tiny_config, tmp_path, children_at_model_load):
    """Forked later, a worker would keep a stale copy of the weights (and, resumed, the optimizer
    state) once the updates rewrite them: the worker that scores is one that was alive
    before the model loaded, in a fresh run and in a resumed one."""
    alive = children_at_model_load
    settings = ["reward_workers=1", "rewards=[rewards_for_tests:scored_by]", f"output_dir={tmp_path / 'run'}"]
    out = train(tiny_config("steps=1", "save_optimizer=true", *settings))
    train(tiny_config("steps=2", "resume=true", *settings))
    scorers = [int(r["generated_reward_mean"]) for r in read_metrics(out) if r["step"] > 0]
    assert len(alive) == 2 and len(scorers) == 2
    assert scorers[0] in alive[0] and scorers[1] in alive[1]


def test_lora_reference_is_the_base_model(tiny_config):
    out = train(tiny_config("model.lora_r=4", "model.lora_alpha=8", "beta=0.1", "steps=2", "lr=5e-2"))
    rows = [r for r in read_metrics(out) if r["step"] > 0]
    assert rows[0]["kl"] == 0.0  # LoRA's B starts at zero: the policy is the base model
    assert rows[1]["kl"] > 0.0  # after one update it has moved away from it
    assert (out / "checkpoints" / "step-000002" / "model" / "adapter_model.safetensors").exists()


def test_full_finetune_kl_uses_a_frozen_reference(tiny_config):
    out = train(tiny_config("beta=0.1", "steps=2", "lr=5e-2"))
    rows = [r for r in read_metrics(out) if r["step"] > 0]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[1]["kl"] > 0.0


def test_time_budget_stops_early(tiny_config):
    out = train(tiny_config("steps=50", "time_budget_s=0.01"))
    rows = read_metrics(out)
    assert max(r["step"] for r in rows) == 1 and "eval_accuracy" in rows[-1]
    assert (out / "checkpoints" / "step-000001").exists()


def test_the_cpu_clock_counts_the_training_processs_cpu_not_its_waits(tiny_config, tmp_path):
    """A reward that waits 0.3 s per call (in the training process) costs wall time and no CPU:
    on the wall clock a 1 s budget ends the run within a few steps; on the CPU clock it runs on."""
    runs = {}
    for clock in ("wall", "cpu"):
        out = train(tiny_config("steps=6", "time_budget_s=1.0", f"clock={clock}", "threads=1", "reward_workers=0",
                                "rewards=[rewards_for_tests:waits]", f"output_dir={tmp_path / clock}"))
        runs[clock] = [r for r in read_metrics(out) if "update_s" in r]
    wall, cpu = runs["wall"], runs["cpu"]
    assert all(r["train_cpu_seconds"] < r["train_seconds"] for r in wall)
    assert [r["train_cpu_seconds"] for r in cpu] == sorted(r["train_cpu_seconds"] for r in cpu)
    assert len(wall) < 6 and wall[-1]["train_seconds"] >= 1.0
    assert len(cpu) > len(wall) and (len(cpu) == 6 or cpu[-1]["train_cpu_seconds"] >= 1.0)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_zero_advantage_rollouts_skip_the_update_but_leave_the_gradient(tiny_config, monkeypatch, loss_type):
    """Against the full computation: the same gradient, with fewer sequences through the model."""
    from podsrl.evaluate import chat_prompt

    c_full = tiny_config("n=4", "m=4", "mode=grpo", f"loss_type={loss_type}", "skip_zero_advantage=false", "micro_batch_size=3")
    s = trainer.setup(c_full)
    problems = [p for _, p in zip(range(2), s.task.train(0))]
    prompts = [chat_prompt(s.tokenizer, s.system_prompt, p.question) for p in problems]
    rollouts = s.engine.generate(prompts, 4, 1.0, 6, seeds=[1, 2])
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.5]])  # group 0: no signal
    chosen = trainer.down_sample(c_full, rewards, step=1)
    assert (chosen.advantages[0] == 0).all() and (chosen.advantages[1] != 0).all()
    start = {k: v.clone() for k, v in s.model.state_dict().items()}
    params = [p for p in s.model.parameters() if p.requires_grad]
    grads, forwarded = [], []
    real_step, real_logprobs = s.optimizer.step, trainer.completion_logprobs
    monkeypatch.setattr(s.optimizer, "step", lambda: grads.append([p.grad.clone() for p in params]) or real_step())
    monkeypatch.setattr(trainer, "completion_logprobs", lambda m, p, *a: forwarded.append(len(p)) or real_logprobs(m, p, *a))
    full = trainer.update(s, c_full, rollouts, chosen, step=1)
    s.model.load_state_dict(start)
    s.optimizer.state.clear()
    skip = trainer.update(s, tiny_config("n=4", "m=4", "mode=grpo", f"loss_type={loss_type}", "micro_batch_size=3"), rollouts, chosen, step=1)
    # 8 sequences, then only the 4 of group 1: packed, or (bnpo, normalised per micro-batch) in
    # TRL's split of the 8 into 3, 3, 2, rows of group 0 left out of each
    assert forwarded[:3] == [3, 3, 2] and forwarded[3:] == ([2, 2] if loss_type == "bnpo" else [3, 1])
    assert full["skipped_zero_advantage"] == 0 and skip["skipped_zero_advantage"] == 4
    assert full["loss"] == pytest.approx(skip["loss"], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    assert any(g.abs().sum() > 0 for g in grads[1])


def test_log_completions_writes_the_first_rollouts_and_survives_resume(tiny_config, tmp_path):
    """log_completions=6 with 2 prompts x n = 4: each step logs prompt 0's 4 rollouts and 2 of
    prompt 1's. Rewards are re-scored here from the logged text; the selected rows are m = 2 per
    full group with advantages of opposite signs (max variance, normalised over the pair);
    a resumed run redoes the steps after its checkpoint without duplicating their lines."""
    from rewards_for_tests import text_length

    reward = "rewards=[rewards_for_tests:text_length]"
    run = train(tiny_config("steps=2", "log_completions=6", reward, f"output_dir={tmp_path / 'logged'}"))
    rows = [json.loads(l) for l in (run / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 6 + [2] * 6
    assert [r["reward"] for r in rows] == text_length([r["completion"] for r in rows])
    for step in (1, 2):
        group = [r for r in rows if r["step"] == step][:4]  # prompt 0's whole group
        assert len({r["question"] for r in group}) == 1
        picked = [r for r in group if r["selected"]]
        assert len(picked) == 2 and all(r["advantage"] is None for r in group if not r["selected"])
        if picked[0]["reward"] != picked[1]["reward"]:
            assert picked[0]["advantage"] == pytest.approx(-picked[1]["advantage"]) != 0
            assert max(r["reward"] for r in group) in [r["reward"] for r in picked]
    evals = [json.loads(l) for l in (run / "eval_completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [0] * 4 + [2] * 4  # all 4 held-out problems, before and after
    test_questions = [p.question for p in task_from_config(tiny_config().task).test]
    assert [r["question"] for r in evals] == test_questions * 2
    accuracy = {r["step"]: r["eval_accuracy"] for r in read_metrics(run) if "eval_accuracy" in r}
    for step in (0, 2):
        assert sum(r["correct"] for r in evals if r["step"] == step) / 4 == accuracy[step]
    resumed = train(tiny_config("steps=3", "resume=true", "log_completions=6", reward, f"output_dir={run}"))
    steps = [json.loads(l)["step"] for l in (resumed / "completions.jsonl").read_text().splitlines()]
    assert steps == [1] * 6 + [2] * 6 + [3] * 6
    steps = [json.loads(l)["step"] for l in (resumed / "eval_completions.jsonl").read_text().splitlines()]
    assert steps == [0] * 4 + [2] * 4 + [3] * 4


@pytest.mark.slow
def test_checkpoints_keep_the_optimizer_state_only_where_a_resume_needs_it(tiny_config, tmp_path, caplog):
    """A run that saves only at its end writes the model alone (Adam's moments are twice its
    trained weights); save_every (or save_optimizer=true) keeps them. A run resumed from a
    checkpoint without them starts a fresh optimizer and says so."""
    import logging

    final = train(tiny_config("steps=1", f"output_dir={tmp_path / 'final'}")) / "checkpoints" / "step-000001"
    assert (final / "model").is_dir() and not (final / "optimizer.pt").exists()
    assert json.loads((final / "trainer_state.json").read_text())["optimizer"] is False
    for extra in ("save_every=1", "save_optimizer=true"):
        kept = train(tiny_config("steps=1", extra, f"output_dir={tmp_path / extra[:6]}")) / "checkpoints" / "step-000001"
        assert (kept / "optimizer.pt").exists()
    with caplog.at_level(logging.WARNING, logger="podsrl.trainer"):
        resumed = train(tiny_config("steps=2", "resume=true", f"output_dir={tmp_path / 'final'}"))
    assert [r["step"] for r in read_metrics(resumed) if "loss" in r] == [1, 2]
    assert any("holds no optimizer state" in r.getMessage() for r in caplog.records)


def test_progress_bars_count_the_clock_under_a_budget_and_show_the_evaluation(tiny_config, capsys):
    """With a time budget (compare's runs, whose steps are unbounded) the bar counts training
    seconds, not a million steps; evaluation has a bar of its own."""
    train(tiny_config("progress=true", "steps=1000000", "time_budget_s=1", "task.test_size=2"))
    err = capsys.readouterr().err
    assert "/1000000" not in err and " s [" in err and "/1 s" in err
    assert "eval:" in err


@pytest.mark.parametrize("mu", [1, 2])
def test_num_iterations_steps_mu_times_with_old_logprobs_taken_once(tiny_config, monkeypatch, mu):
    """num_iterations = mu optimizer steps over the same rollouts: with mu = 1 one forward per
    micro-batch (no old-policy pass, as in TRL); with mu = 2 one no-grad pass for the old policy's
    log-probs, then two steps, the second off-policy (the ratio moves, the clip can act). Every
    forward is at the rollout temperature."""
    from podsrl.evaluate import chat_prompt

    c = tiny_config("n=4", "m=4", "mode=grpo", f"num_iterations={mu}", "lr=0.05", "epsilon_low=0.01",
                    "epsilon_high=0.01", "rollout.temperature=0.7")
    s = trainer.setup(c)
    problems = [p for _, p in zip(range(2), s.task.train(0))]
    rollouts = s.engine.generate([chat_prompt(s.tokenizer, s.system_prompt, p.question) for p in problems], 4, 1.0, 6,
                                 seeds=[1, 2])
    chosen = trainer.down_sample(c, torch.tensor([[0.0, 1.0, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]]), step=1)
    calls, steps, ratios = [], [], []
    real_logprobs, real_step, real_loss = trainer.completion_logprobs, s.optimizer.step, trainer.policy_loss
    monkeypatch.setattr(trainer, "completion_logprobs",
                        lambda m, *a: calls.append((torch.is_grad_enabled(), a[-1])) or real_logprobs(m, *a))
    monkeypatch.setattr(s.optimizer, "step", lambda: steps.append(1) or real_step())

    def spy_loss(logp, advantages, mask, **kw):
        loss, stats = real_loss(logp, advantages, mask, **kw)
        ratios.append(float(stats.ratio))
        return loss, stats

    monkeypatch.setattr(trainer, "policy_loss", spy_loss)
    record = trainer.update(s, c, rollouts, chosen, step=1)
    assert all(t == 0.7 for _, t in calls)
    assert [grad for grad, _ in calls] == ([True] if mu == 1 else [False, True, True])
    assert len(steps) == mu
    assert ratios[0] == pytest.approx(1.0, abs=1e-6)
    if mu == 2:
        assert abs(ratios[1] - 1.0) > 1e-3 and record["clip_ratio/region_mean"] > 0
        assert record["clip_ratio/region_mean"] == pytest.approx(
            record["clip_ratio/low_mean"] + record["clip_ratio/high_mean"])
    else:
        assert record["clip_ratio/region_mean"] == 0.0


def test_each_start_of_a_run_records_the_code_and_machine_it_trained_with(tiny_config, tmp_path):
    """podsrl_commit.txt: a line per start (started, then resumed), naming the checkout's commit
    and the machine: the processor, its logical CPUs and the run's torch threads (its ``threads``)."""
    import os
    import re
    import subprocess as sp

    from podsrl.rundir import COMMIT_FILE

    out = train(tiny_config("steps=1", "threads=1", f"output_dir={tmp_path / 'run'}"))
    train(tiny_config("steps=2", "threads=2", "resume=true", f"output_dir={out}"))
    line = re.compile(r"(\S+) (started|resumed) \S+ on (\d+) x (.+), (\d+) torch threads")
    lines = [line.fullmatch(text).groups() for text in (out / COMMIT_FILE).read_text().splitlines()]
    head = sp.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True).stdout.strip()
    assert [how for _, how, *_ in lines] == ["started", "resumed"]
    assert all(commit.removesuffix("+dirty") == head for commit, *_ in lines)
    assert [(int(cpus), int(threads)) for _, _, cpus, _, threads in lines] == [(os.cpu_count(), 1), (os.cpu_count(), 2)]
    cpuinfo = Path("/proc/cpuinfo")
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE) if cpuinfo.exists() else []
    if models:  # Linux on x86: the processor's model name as the kernel gives it
        assert [model for _, _, _, model, _ in lines] == [models[0].strip()] * 2
