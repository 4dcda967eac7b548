"""podsrl.sampling: the paper's step with every option off; adaptive n, the history filter and
dynamic sampling against brute force and hand-worked cases; resume; several processes."""

import itertools
import json
import math
import random
import subprocess
import sys

import pytest
import torch

from conftest import REPO, free_port, subprocess_env
from podsrl import trainer
from podsrl.downsample import select
from podsrl.evaluate import chat_prompt
from podsrl.sampling import settled, skip_probability, step_seed
from podsrl.trainer import train


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- the rule that stops a prompt


def selected_values(rewards, m):
    r = torch.tensor(rewards, dtype=torch.float64)
    return sorted(r[select(r, m)].tolist())


def variance(values):
    return torch.tensor(values, dtype=torch.float64).var(unbiased=False).item()


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6])
def test_settled_is_exactly_when_no_binary_rollout_can_change_the_selection(m):
    """Brute force over every 0/1 group of m to m + 2 rewards: settled iff no further ⌈m/2⌉
    rollouts (any 0/1 values; more are never needed to balance a group) raise the variance of the rewards max-variance selection takes; for even m, iff
    they cannot change those rewards at all (odd m has two equally good choices, ⌈m/2⌉ ones or
    ⌈m/2⌉ zeros, and more rollouts may swap one for the other)."""
    for k in range(m, m + 3):
        for rewards in itertools.product([0.0, 1.0], repeat=k):
            rewards = list(rewards)
            now = selected_values(rewards, m)
            later = [selected_values(rewards + list(more), m)
                     for extra in range(1, (m + 1) // 2 + 1) for more in itertools.product([0.0, 1.0], repeat=extra)]
            assert settled(rewards, m, (0.0, 1.0)) == all(variance(v) <= variance(now) + 1e-12 for v in later), (rewards, m)
            if m % 2 == 0:
                assert settled(rewards, m, (0.0, 1.0)) == all(v == now for v in later), (rewards, m)


ACCURACY_AND_FORMAT = [0.0, 0.2, 1.0, 1.2]  # accuracy + 0.2 * format: bounds (0, 1.2)


@pytest.mark.parametrize("m", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_settled_is_exactly_when_no_rollout_within_the_bounds_can_change_the_selection(m):
    """Rewards of four values (accuracy + 0.2 * format): settled iff no further rollouts, of any
    of the values, change the selected rewards' variance (for even m: the selected rewards); a
    group holding only 0.2 and 1.2 is not settled, as a later 0 would change its selection."""
    for k in range(m, m + 3):
        for rewards in itertools.product(ACCURACY_AND_FORMAT, repeat=k):
            rewards = list(rewards)
            now = selected_values(rewards, m)
            later = [selected_values(rewards + list(more), m) for extra in range(1, (m + 1) // 2 + 1)
                     for more in itertools.product(ACCURACY_AND_FORMAT, repeat=extra)]
            unchanged = all(variance(v) <= variance(now) + 1e-9 for v in later)
            assert settled(rewards, m, (0.0, 1.2)) == unchanged, (rewards, m)
            if m % 2 == 0:
                assert settled(rewards, m, (0.0, 1.2)) == all(v == now for v in later), (rewards, m)
    assert not settled([0.2, 1.2, 0.2, 1.2], 2, (0.0, 1.2)) and settled([0.0, 1.2], 2, (0.0, 1.2))


@pytest.mark.slow
def test_adaptive_n_with_accuracy_and_format_selects_what_pods_selects_from_all_n():
    """For every group of n = 6 rollouts of accuracy + 0.2 * format (4^6 of them) and m = 2, 4:
    the rounds of 2 that adaptive_n draws (stopping once settled) reach the selection, rewards and
    advantages PODS takes from all n; the rule that settles on the range seen so far does not."""
    from podsrl.advantages import group_advantages
    from podsrl.rewards import format_reward, accuracy_reward, reward_bounds

    bounds = reward_bounds({"accuracy": accuracy_reward, "format": format_reward}, [1.0, 0.2])
    assert bounds == pytest.approx((0.0, 1.2))
    seen_range_differs = 0
    for m in (2, 4):
        for group in itertools.product(ACCURACY_AND_FORMAT, repeat=6):
            group = torch.tensor(group)
            size = 2
            while size < 6 and not settled(group[:size].tolist(), m, bounds):
                size += 2
            pods, adaptive = group[select(group, m)], group[:size][select(group[:size], m)]
            assert sorted(adaptive.tolist()) == sorted(pods.tolist())
            assert torch.equal(group_advantages(adaptive.sort().values[None]), group_advantages(pods.sort().values[None]))
            seen = 2
            while seen < 6 and not (min(group[:seen]) < max(group[:seen]) and settled(group[:seen].tolist(), m,
                                                                                      (min(group[:seen]), max(group[:seen])))):
                seen += 2
            seen_range_differs += sorted(group[:seen][select(group[:seen], m)].tolist()) != sorted(pods.tolist())
    assert seen_range_differs > 0


def test_hand_worked_settled_cases():
    assert settled([1, 0, 1, 0], 4, (0, 1)) and not settled([1, 1, 1, 0], 4, (0, 1)) and not settled([1] * 8, 4, (0, 1))
    assert settled([0.2, 0.9, 0.9, 0.2, 0.5], 4, (0.2, 0.9)) and not settled([0.2, 0.9, 0.5, 0.2, 0.6], 4, (0.2, 0.9))
    assert not settled([0.2, 0.9, 0.9, 0.2, 0.5], 4, (0.0, 1.0))  # the ends seen are not the bounds
    assert settled([0, 1, 1], 3, (0, 1)) and not settled([0, 1, 0.5], 3, (0, 1))
    assert settled([0.2, 1.2], 2, (0.2, 1.2)) and settled([0.2 + 1e-9, 1.2], 2, (0.2, 1.2))


def test_skip_probability_grows_and_never_reaches_one():
    assert skip_probability(0, 0.5) == 0.0
    assert [skip_probability(z, 0.5) for z in (1, 2, 3)] == [0.5, 0.75, 0.875]
    assert skip_probability(50, 0.5) == pytest.approx(0.99) and skip_probability(50, 0.95) < 1.0


# --------------------------------------------------------------------------- the trainer's sampler


def setup(tiny_config, *overrides):
    c = tiny_config(*overrides)
    return c, trainer.setup(c)


def test_with_every_option_off_a_step_is_the_papers(tiny_config):
    """The sampler's groups equal what the loop computed before it had a sampler: the next
    prompts_per_step prompts of the stream, n rollouts each from one generate call with the
    step's seeds, scored as one matrix."""
    c, s = setup(tiny_config, "n=6", "prompts_per_step=3")
    stream = s.task.train(c.seed)
    try:
        for step in (1, 2):
            groups = s.sampler.step_groups(step)
            problems = [next(stream) for _ in range(3)]
            prompts = [chat_prompt(s.tokenizer, s.system_prompt, p.question) for p in problems]
            scores = s.scorer.start({"prompts": prompts, "answer": [p.answer for p in problems],
                                     "question": [p.question for p in problems]}, 6)
            expected = s.engine.generate(prompts, 6, c.rollout.temperature, c.rollout.max_new_tokens,
                                         seeds=[step_seed(c.seed, step, i) for i in range(3)], on_chunk=scores.add)
            assert groups.problems == problems and groups.sizes == [6, 6, 6]
            for got, want in zip(groups.rollouts, expected):
                assert (got == want) if isinstance(got, (list, type(None))) else torch.equal(got, want)
            assert torch.equal(groups.rewards, scores.result().rewards)
            assert groups.counts == {"rollouts_generated": 18, "prompts_skipped": 0, "groups_filtered": 0,
                                     "dynamic_rounds": 1, "adaptive_rounds": 1}
        assert s.sampler.state_dict()["consumed"] == 6
    finally:
        s.scorer.close()
        s.run.release()


def test_rollouts_in_rounds_are_those_of_one_call(tiny_config):
    c, s = setup(tiny_config)
    try:
        s.engine.model.double()  # float64: batches of 12 and of 4 rows round alike (see test_rollout.py)
        prompts = [chat_prompt(s.tokenizer, s.system_prompt, q) for q in ("1 + 2 =", "3 * 4 =")]
        whole = s.engine.generate(prompts, 6, 1.0, 5, seeds=[11, 12])
        first = s.engine.generate(prompts, 2, 1.0, 5, seeds=[11, 12])
        rest = s.engine.generate(prompts, 4, 1.0, 5, seeds=[11, 12], first_row=2)
        assert [whole.texts[i * 6 : i * 6 + 6] for i in range(2)] == \
            [first.texts[i * 2 : i * 2 + 2] + rest.texts[i * 4 : i * 4 + 4] for i in range(2)]
    finally:
        s.scorer.close()
        s.run.release()


def test_adaptive_n_stops_a_prompt_once_settled(tiny_config):
    """Rounds of 2 up to n = 8 with m = 2: a prompt stops as soon as its rewards hold the lowest and
    the highest value declared (0 and 1); a prompt whose rewards stay equal takes all 8."""
    c, s = setup(tiny_config, "n=8", "m=2", "adaptive_n=true", "adaptive_round=2", "prompts_per_step=4",
                 "rewards=[rewards_for_tests:constant_on_even]")
    try:
        for step in (1, 2, 3):
            groups = s.sampler.step_groups(step)
            for p, size in enumerate(groups.sizes):
                rewards = groups.rewards[p, :size].tolist()
                assert size % 2 == 0 and 2 <= size <= 8 and not math.isnan(sum(rewards))
                assert all(math.isnan(x) for x in groups.rewards[p, size:].tolist())
                # it ran until settled (or until n), and not one round longer
                assert settled(rewards, 2, (0.0, 1.0)) or size == 8
                assert size == 2 or not settled(rewards[: size - 2], 2, (0.0, 1.0))
                if int(groups.problems[p].question.split()[0]) % 2 == 0:
                    assert size == 8  # all equal: never settles
            assert groups.counts["rollouts_generated"] == sum(groups.sizes) == len(groups.rollouts.texts)
            assert groups.counts["adaptive_rounds"] == max(groups.sizes) // 2
            chosen = trainer.down_sample(c, groups.rewards, step, groups.sizes)
            starts = [0, *itertools.accumulate(groups.sizes)]
            for p in range(4):  # the selected rows lie in the prompt's own group, the max-variance pair
                rows = chosen.rows[p * 2 : p * 2 + 2].tolist()
                assert all(starts[p] <= r < starts[p + 1] for r in rows)
                own = groups.rewards[p, : groups.sizes[p]]
                assert chosen.rewards[p].var(unbiased=False) == pytest.approx(float(own.max() - own.min()) ** 2 / 4)
    finally:
        s.scorer.close()
        s.run.release()


def test_dynamic_sampling_keeps_groups_with_signal(tiny_config):
    """A reward constant on questions whose first operand is even: their groups are dropped and
    batches of 4 prompts drawn until 4 groups have signal; the step trains the first 4, in the
    order drawn. (A group of varied rewards may still come out all equal by chance, hence "at
    least" on the rounds and the groups dropped.)"""
    c, s = setup(tiny_config, "mode=grpo", "m=4", "dynamic_sampling=true", "prompts_per_step=4",
                 "rewards=[rewards_for_tests:constant_on_even]")
    stream = s.task.train(c.seed)
    odd = lambda p: int(p.question.split()[0]) % 2 == 1
    try:
        groups = s.sampler.step_groups(1)
        rounds = groups.counts["dynamic_rounds"]
        drawn = [next(stream) for _ in range(4 * rounds)]
        rest = iter(drawn)
        assert len(groups.problems) == 4 and all(any(p == q for q in rest) for p in groups.problems)  # in order drawn
        assert all(odd(p) for p in groups.problems)
        assert all(groups.rewards[p].max() > groups.rewards[p].min() for p in range(4))
        fewest = next(r for r in range(1, rounds + 1) if sum(map(odd, drawn[: 4 * r])) >= 4)
        assert rounds >= fewest and groups.counts["groups_filtered"] >= sum(not odd(p) for p in drawn[: 4 * rounds])
        assert groups.counts["rollouts_generated"] == 4 * 4 * rounds and s.sampler.consumed == 4 * rounds
    finally:
        s.scorer.close()
        s.run.release()


def test_dynamic_sampling_fills_up_with_dropped_groups_after_its_last_round(tiny_config):
    """Every group without signal (a constant reward) and at most 3 batches: the step trains the
    first batch's groups, after drawing three."""
    c, s = setup(tiny_config, "dynamic_sampling=true", "dynamic_sampling_rounds=3", "rewards=[format]")
    stream = s.task.train(c.seed)
    try:
        groups = s.sampler.step_groups(1)
        drawn = [next(stream) for _ in range(6)]
        assert groups.problems == drawn[:2] and groups.counts["dynamic_rounds"] == 3
        assert groups.counts["groups_filtered"] == 6 and groups.counts["rollouts_generated"] == 6 * 4
        assert s.sampler.state_dict()["consumed"] == 6
    finally:
        s.scorer.close()
        s.run.release()


def test_the_history_filter_skips_all_equal_prompts_and_replaces_them(tiny_config):
    """Two all-equal groups of a prompt in a row make it skipped with probability 1 - 0.5^2 (p as
    it starts); the step still trains prompts_per_step prompts, and the draws are seeded."""
    c, s = setup(tiny_config, "prompt_filter=history", "prompts_per_step=2")
    try:
        sampler = s.sampler
        first = next(s.task.train(c.seed))
        sampler.history = {first.question: 2}
        rng = random.Random(f"{c.seed}-1-0")
        skipped = rng.random() < skip_probability(2, sampler.keep)
        groups = sampler.step_groups(1)
        assert len(groups.problems) == 2 and (first not in groups.problems) == skipped
        assert groups.counts["prompts_skipped"] == int(skipped) and sampler.consumed == 2 + int(skipped)
        # the outcomes of this step's groups are remembered: all equal adds one, signal resets
        for g in range(2):
            rewards = groups.rewards[g]
            expected = (0 if skipped or groups.problems[g] != first else 2) + 1 if rewards.max() == rewards.min() else 0
            assert sampler.history[groups.problems[g].question] == expected
        assert sampler.keep == pytest.approx(0.49 if sum(float(r.max() == r.min()) for r in groups.rewards) / 2 >= 0.25 else 0.51)
    finally:
        s.scorer.close()
        s.run.release()


def test_the_history_filter_skips_at_the_stated_rate():
    """A stream alternating two prompts, one with two all-equal groups in a row (skipped with
    probability 1 - 0.5^2 = 0.75 while p is 0.5), the other with none (never skipped)."""
    from podsrl.sampling import Sampler

    class Problem:
        def __init__(self, question):
            self.question, self.answer = question, "0"

    class Task:
        def train(self, seed):
            return (Problem(f"q{i % 2}") for i in itertools.count())

    class OneProcess:
        process_index, num_processes = 0, 1

    c = type("C", (), {"seed": 0, "prompts_per_step": 1, "prompt_filter": "history"})()
    sampler = Sampler(c, Task(), None, None, None, None, OneProcess())
    sampler.history = {"q0": 2, "q1": 0}
    counts = {"prompts_skipped": 0, "dynamic_rounds": 0}
    kept = [sampler._draw(step, counts)[0].question for step in range(4000)]
    kept_q0 = kept.count("q0")
    assert sampler.consumed == 4000 + counts["prompts_skipped"]
    assert counts["prompts_skipped"] / (counts["prompts_skipped"] + kept_q0) == pytest.approx(0.75, abs=0.03)
    again = Sampler(c, Task(), None, None, None, None, OneProcess())
    again.history = {"q0": 2, "q1": 0}
    assert [again._draw(step, {"prompts_skipped": 0, "dynamic_rounds": 0})[0].question for step in range(50)] == kept[:50]


# --------------------------------------------------------------------------- runs


ALL_ON = ["adaptive_n=true", "adaptive_round=2", "prompt_filter=history", "dynamic_sampling=true", "n=8", "m=2"]


def test_every_option_on_resumes_exactly(tiny_config, tmp_path):
    straight = train(tiny_config(*ALL_ON, "steps=4", f"output_dir={tmp_path / 'straight'}"))
    part = train(tiny_config(*ALL_ON, "steps=2", "save_optimizer=true", f"output_dir={tmp_path / 'resumed'}"))
    resumed = train(tiny_config(*ALL_ON, "steps=4", "resume=true", f"output_dir={part}"))
    a = [r for r in read_metrics(straight) if r["step"] > 0]
    b = [r for r in read_metrics(resumed) if r["step"] > 0]
    keys = ["generated_reward_mean", "selected_reward_mean", "rollouts_generated", "prompts_skipped", "groups_filtered",
            "dynamic_rounds", "adaptive_rounds", "trained_sequences"]
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert all(x["loss"] == pytest.approx(y["loss"], abs=1e-7) for x, y in zip(a, b))
    assert all(r["trained_sequences"] == 2 * 2 for r in a)


def test_adaptive_n_trains_m_of_each_groups_rounds(tiny_config):
    out = train(tiny_config("adaptive_n=true", "n=8", "m=4", "rule=max_variance", "steps=1", "log_completions=100"))
    row = [r for r in read_metrics(out) if r["step"] == 1][0]
    assert row["trained_sequences"] == 2 * 4 and 2 * 4 <= row["rollouts_generated"] <= 2 * 8
    logged = [json.loads(l) for l in (out / "completions.jsonl").read_text().splitlines()]  # every rollout
    assert len(logged) == row["rollouts_generated"]
    for question in {r["question"] for r in logged}:
        group = [r for r in logged if r["question"] == question]
        assert len(group) % 4 == 0 and sum(r["selected"] for r in group) == 4


def test_lora_and_trl_rewards_with_every_option(tiny_config):
    out = train(tiny_config(*ALL_ON, "model.lora_r=4", "rewards=[accuracy,rewards_for_tests:varied]",
                            "reward_weights=[1.0,0.5]", "steps=2"))
    rows = [r for r in read_metrics(out) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2] and all("scored_reward/accuracy" in r for r in rows)
    assert (out / "checkpoints" / "step-000002" / "model" / "adapter_model.safetensors").exists()


def test_adaptive_n_needs_pods(tiny_config):
    from podsrl.errors import PodsError

    with pytest.raises(PodsError, match="adaptive_n needs mode=pods"):
        tiny_config("adaptive_n=true", "mode=grpo")


@pytest.mark.parametrize("rule", ["max_reward", "random", "percentile"])
def test_adaptive_n_with_another_rule_is_refused(tiny_config, rule):
    """Its stopping rule holds for max-variance selection only: a group of 0/1 rewards stops at
    [0, 0, 1, 1], where max_reward over all n rollouts could take four 1s (and random or
    percentile, a subset of all n)."""
    from podsrl.errors import PodsError

    with pytest.raises(PodsError, match=f"adaptive_n needs rule=max_variance .*rule={rule} selects from all n"):
        tiny_config("adaptive_n=true", "n=8", "m=4", f"rule={rule}")


def test_adaptive_n_refuses_a_reward_without_declared_bounds(tiny_config):
    """Settling a prompt needs the lowest and highest reward possible: a function that does not
    declare them is refused in one line; with its bounds declared it runs."""
    import rewards_for_tests
    from podsrl.errors import PodsError

    with pytest.raises(PodsError, match=r"^adaptive_n needs each reward's declared bounds .*'rewards_for_tests:threads' "
                                        r"declares none \(set its bounds attribute to \(lowest, highest\)\)$"):
        tiny_config("adaptive_n=true", "rewards=[accuracy,rewards_for_tests:threads]", "reward_weights=[1.0,1.0]")
    tiny_config("rewards=[rewards_for_tests:threads]")  # without adaptive_n: any reward
    assert rewards_for_tests.varied.bounds == (0.0, 1.0)
    tiny_config("adaptive_n=true", "rewards=[accuracy,format]", "reward_weights=[1.0,0.2]")


@pytest.mark.slow
def test_two_processes_with_every_option(tiny_model_dir, tmp_path):
    """Under accelerate launch (two CPU processes over gloo) the options run to the end: the
    processes draw the same prompts, share the history and take part in every round."""
    run = tmp_path / "two"
    overrides = [f"model.name_or_path={tiny_model_dir}", "steps=3", "prompts_per_step=4", "task.test_size=4",
                 "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:constant_on_even]",
                 *ALL_ON, f"output_dir={run}"]
    env = {**subprocess_env(), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()),
                             "--config_file", str(REPO / "configs" / "accelerate" / "cpu_2proc.yaml"), "-m", "podsrl",
                             "train", *overrides], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["trained_sequences"] == 4 * 2 and r["rollouts_generated"] >= 4 * 2
        assert r["dynamic_rounds"] >= 1
    state = json.loads((run / "checkpoints" / "step-000003" / "trainer_state.json").read_text())["sampling"]
    assert state["consumed"] >= 3 * 4 and state["history"]
