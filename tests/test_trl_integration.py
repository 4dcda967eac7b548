"""PODSTrainer (TRL's GRPOTrainer with down-sampling) on a tiny random Llama, on the CPU.

What reaches the loss is observed from outside the trainer: the reward function records every
completion it scores (all n of each prompt) and a wrapper around TRL's ``_compute_loss`` records
the inputs it receives. Selection is checked against brute force over the group's subsets and
advantages against TRL's formula.
"""

import importlib
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from itertools import combinations
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from podsrl.integrations import trl as pods_trl  # noqa: E402
from podsrl.integrations.trl import PODSConfig, PODSTrainer, check_pods_config, subset_advantages  # noqa: E402
from conftest import REPO, free_port, install_command, subprocess_env  # noqa: E402
from rewards_for_tests import varied  # noqa: E402

PROMPTS = [f"{a} + {b} =" for a in range(4) for b in range(4)]


class Recorder:
    """Sees a trainer from outside: the completions scored (all n) and the inputs of each loss call."""

    def __init__(self):
        self.scored = []  # per generation batch: [(prompt, completion ids, reward)]
        self.losses = []  # per loss call: the inputs, on the CPU

    def reward(self, prompts, completions, completion_ids, **_):
        values = varied(completions, completion_ids)
        self.scored.append(list(zip(prompts, map(tuple, completion_ids), values)))
        return values

    def attach(self, trainer):
        inner = trainer._compute_loss

        def spy(model, inputs):
            self.losses.append({k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
            return inner(model, inputs)

        trainer._compute_loss = spy
        return trainer


@pytest.fixture
def make_trainer(tiny_model_dir, tmp_path):
    """Factory: a GRPOTrainer or PODSTrainer on a fresh copy of the tiny model."""

    def make(cls, reward=varied, peft_config=None, rollout_func=None, **overrides):
        config = PODSConfig if cls is PODSTrainer else GRPOConfig
        options = dict(output_dir=str(tmp_path / cls.__name__), use_cpu=True, report_to="none", bf16=False,
                       max_completion_length=6, learning_rate=1e-2, max_steps=2, logging_steps=1,
                       save_strategy="no", seed=0, disable_tqdm=True)
        args = config(**(options | overrides))
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
        return cls(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                   processing_class=tokenizer, peft_config=peft_config, rollout_func=rollout_func)

    return make


def trained_ids(inputs):
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(inputs["completion_ids"], inputs["completion_mask"])]


def population_variance(values):
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


OBJECTIVES = {"max_variance": population_variance, "max_reward": sum}


@pytest.mark.parametrize(
    "rule,n,m,per_device,accumulation,lora",
    [("max_variance", 8, 3, 16, 1, False), ("max_reward", 8, 3, 16, 1, False), ("max_variance", 4, 2, 4, 2, False),
     ("max_variance", 8, 3, 16, 1, True)],
)
def test_loss_receives_only_the_selected_completions(make_trainer, rule, n, m, per_device, accumulation, lora):
    rec = Recorder()
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    trainer = make_trainer(PODSTrainer, rec.reward, num_generations=n, pods_m=m, pods_rule=rule, peft_config=peft,
                           per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    rec.attach(trainer).train()
    steps_per_generation = accumulation  # TRL's default
    assert len(rec.losses) == len(rec.scored) * steps_per_generation == 2 * accumulation
    for b, scored in enumerate(rec.scored):
        calls = rec.losses[b * steps_per_generation : (b + 1) * steps_per_generation]
        completions = {ids: (prompt, r) for prompt, ids, r in scored}
        assert len(completions) == len(scored) == per_device * steps_per_generation  # distinct: identifiable
        groups = defaultdict(list)  # prompt -> [(reward, advantage)] of the completions the loss received
        for inputs in calls:
            assert len(trained_ids(inputs)) == per_device * m // n  # each micro-batch shrank from n to m per group
            for ids, adv in zip(trained_ids(inputs), inputs["advantages"].tolist()):
                prompt, r = completions[ids]
                groups[prompt].append((r, adv))
            # dapo (TRL's default loss) normalises by the tokens of the generation batch: the trained ones only
            total_tokens = sum(int(c["completion_mask"].sum()) for c in calls)
            assert int(inputs["num_items_in_batch"]) == total_tokens
        assert len(groups) == len(scored) // n and all(len(g) == m for g in groups.values())
        assert len({ids for c in calls for ids in trained_ids(c)}) == len(groups) * m  # no completion twice
        for prompt, chosen in groups.items():
            group_rewards = [r for p, _, r in scored if p == prompt]
            rewards = [r for r, _ in chosen]
            best = max(OBJECTIVES[rule](list(s)) for s in combinations(group_rewards, m))
            assert OBJECTIVES[rule](rewards) == pytest.approx(best)  # the rule's optimum, by brute force
            r = torch.tensor(rewards)
            expected = (r - r.mean()) / (r.std() + 1e-4)  # TRL's advantages, over the m selected
            assert torch.allclose(torch.tensor([a for _, a in chosen]), expected, atol=1e-5)
    logs = [row for row in trainer.state.log_history if "pods/selected_reward" in row]
    assert len(logs) == 2 and all("reward" in row for row in logs)  # all n (TRL's) and the selected m


def first_token_mod_3(completion_ids, **_):
    """A second reward, declining (None) the completions that end in an even token id."""
    return [None if ids[-1] % 2 == 0 else float(ids[0] % 3) for ids in completion_ids]


@pytest.mark.parametrize(
    "scale,lora,aggregation",
    [("group", False, "sum_then_normalize"), ("batch", False, "sum_then_normalize"),
     ("none", False, "sum_then_normalize"), ("group", True, "sum_then_normalize"),
     ("group", False, "normalize_then_sum")],
)
def test_m_equal_to_n_updates_like_grpo(make_trainer, scale, lora, aggregation):
    unscorable = []  # completions that no reward function scores: TRL leaves them out of the statistics

    def varied_or_none(completions, completion_ids, **_):
        unscorable.extend(ids[-1] % 4 == 0 for ids in completion_ids)
        return [None if ids[-1] % 4 == 0 else v for ids, v in zip(completion_ids, varied(completions, completion_ids))]

    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    # SGD: Adam's first steps move every weight by about lr whatever its gradient's size, so rounding
    # noise (TRL's nanstd and torch.std differ in the last bit) would look like a different update
    common = dict(num_generations=4, per_device_train_batch_size=8, scale_rewards=scale, peft_config=peft, optim="sgd",
                  reward=[varied_or_none, first_token_mod_3], reward_weights=[1.0, 0.5],
                  multi_objective_aggregation=aggregation)
    grpo = make_trainer(GRPOTrainer, **common)
    before = {k: v.clone() for k, v in grpo.model.named_parameters()}
    grpo.train()
    pods = make_trainer(PODSTrainer, pods_m=4, **common)
    pods.train()
    a, b = dict(grpo.model.named_parameters()), dict(pods.model.named_parameters())
    assert a.keys() == b.keys()
    moved = [k for k in a if not torch.equal(a[k], before[k])]
    assert moved and (all("lora_" in k for k in moved) if lora else True)  # LoRA: only the adapter trains
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-7), (k, (a[k] - b[k]).abs().max())
    assert any(unscorable)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_per_completion_tensors_stay_with_their_rows(make_trainer, loss_type):
    """beta > 0 and steps_per_generation > gradient_accumulation_steps make TRL compute reference and
    old-policy log-probabilities of all n at generation; at the first loss call the policy is still
    the reference and the old policy, so both must equal the log-probabilities of the rows received."""
    rec, checked = Recorder(), []
    trainer = make_trainer(PODSTrainer, rec.reward, num_generations=4, pods_m=2, per_device_train_batch_size=4,
                           steps_per_generation=2, beta=0.1, max_steps=1, loss_type=loss_type)
    inner = trainer._compute_loss

    def check(model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            width = inputs["completion_ids"].shape[1]
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width)
        keep = inputs["completion_mask"].bool()
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            checked.append(torch.allclose(inputs[key][keep], logps[keep], atol=1e-5))
        return inner(model, inputs)

    trainer._compute_loss = check
    rec.attach(trainer).train()
    assert checked == [True, True]
    assert len(trained_ids(rec.losses[0])) == 2  # 2 groups of 4 generated, 2 x 2 kept, 2 micro-batches


@pytest.mark.slow
def test_two_processes_select_per_group_with_the_batch_std_over_both(tiny_model_dir, tmp_path):
    """accelerate launch, 2 processes (gloo), each holding one group of n = 4 per step, m = 2,
    scale_rewards="batch": the std is over the selected rewards of both processes. With beta > 0
    each process computes the reference log-probabilities of its own kept rows."""
    env = {**subprocess_env(), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()), "--config_file",
                          str(REPO / "configs" / "accelerate" / "cpu_2proc.yaml"),
                          str(REPO / "tests" / "trl_distributed_worker.py"), tiny_model_dir, str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and ranks[0]["params"] == ranks[1]["params"]
    for step in range(2):
        chosen = []  # per rank: the rewards and advantages of the completions its loss received
        for r in ranks:
            scored, inputs = r["scored"][step], r["losses"][step]
            assert len(scored) == 4 and len({p for p, _, _ in scored}) == 1  # one whole group per process
            reward_of = {tuple(ids): value for _, ids, value in scored}
            assert len(reward_of) == 4  # distinct completions: identifiable
            rewards = [reward_of[tuple(ids)] for ids in inputs["completion_ids"]]
            assert len(rewards) == 2 and population_variance(rewards) == pytest.approx(
                max(population_variance(list(c)) for c in combinations(reward_of.values(), 2)))
            chosen.append((torch.tensor(rewards), torch.tensor(inputs["advantages"])))
        batch_std = torch.cat([rewards for rewards, _ in chosen]).std()
        for rewards, adv in chosen:
            assert torch.allclose(adv, (rewards - rewards.mean()) / (batch_std + 1e-4), atol=1e-5)


def test_subset_advantages_follow_trl_formula():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 4, (6, 5), generator=g).float()
    r[1, 2] = r[3, 0] = r[3, 4] = math.nan  # completions every reward function declined (None)
    r[4] = torch.tensor([math.nan, math.nan, math.nan, math.nan, 2.0])  # one scorable completion
    # TRL (sum_then_normalize): NaN-aware group mean; std per group or over the batch; 1e-4; NaN -> 0
    centred = r - torch.nanmean(r, 1, keepdim=True)
    expected = {
        "group": centred / (nanstd(r, dim=1, keepdim=True) + 1e-4),
        "batch": centred / (nanstd(r) + 1e-4),
        "none": centred,
    }
    for scale, want in expected.items():
        got = subset_advantages(r, scale)
        assert torch.allclose(got, torch.nan_to_num(want, nan=0.0), atol=1e-5), scale
        assert torch.equal(got[r.isnan()], torch.zeros(int(r.isnan().sum())))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(pods_m=9), "pods_m must be an integer in 2..num_generations = 2..8"),
        (dict(pods_m=1), "pods_m must be an integer in 2..num_generations"),
        (dict(pods_m=None), "pods_m must be an integer"),
        (dict(pods_m=2.0), "pods_m must be an integer"),
        (dict(pods_rule="best"), "unknown pods_rule 'best'"),
        # 8 completions per generation batch hold 2 groups of 4; 2 x 3 kept do not split into 4 micro-batches
        (dict(num_generations=4, pods_m=3, per_device_train_batch_size=2, gradient_accumulation_steps=4),
         "do not split into steps_per_generation = 4 equal micro-batches"),
        # TRL's own check: a generation batch of 12 completions is not whole groups of 8
        (dict(per_device_train_batch_size=12), "must be divisible by num_generations"),
    ],
)
def test_bad_settings_are_refused_at_construction(tmp_path, overrides, message):
    options = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=8,
                   per_device_train_batch_size=8, pods_m=4)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PODSConfig(**(options | overrides))


def test_pods_m_may_be_any_integer_type(tmp_path):
    import numpy as np

    args = PODSConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=8,
                      per_device_train_batch_size=8, pods_m=np.int64(2))
    assert args.pods_m == 2 and type(args.pods_m) is int


def test_groups_split_across_processes_are_refused():
    # Two processes, 3 completions each per step: TRL's global batch of 6... holds whole groups of 2
    # only if each process does; 3 per process with n = 2 would split a group between processes.
    args = SimpleNamespace(num_generations=2, pods_m=2, pods_rule="max_variance",
                           multi_objective_aggregation="sum_then_normalize",
                           per_device_train_batch_size=3, steps_per_generation=1)
    with pytest.raises(ValueError, match="each process must hold whole groups"):
        check_pods_config(args)


def test_trainer_needs_a_pods_config(tmp_path, tiny_model_dir):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=4,
                      per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="PODSConfig"):
        PODSTrainer(model=tiny_model_dir, reward_funcs=varied, args=args)


@pytest.mark.parametrize("version,supported", [("1.16.0", True), ("1.16.3", True), ("1.15.0", False),
                                               ("1.17.0", False), ("0.24.0", False), ("unknown", False)])
def test_trl_version_check(version, supported):
    if supported:
        pods_trl.check_trl_version(version)
    else:
        with pytest.raises(ImportError, match=r"supports trl>=1\.16,<1\.17"):
            pods_trl.check_trl_version(version)


def test_unsupported_trl_is_refused_at_import(monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.15.0")
    monkeypatch.delitem(sys.modules, "podsrl.integrations.trl")
    with pytest.raises(ImportError, match=r"trl>=1\.16,<1\.17.*found trl 1\.15\.0"):
        importlib.import_module("podsrl.integrations.trl")


# --------------------------------------------------------------------------- scripted rollouts


class ScriptedRollout:
    """A ``rollout_func`` (TRL 1.16 calls it instead of generating, vLLM or not): completion r of a
    generation batch gets its own token ids (its first one names it), 3 to 5 of them, ending in EOS
    unless ``truncated(position)``, where position = r mod n is its place in its group; an
    ``env_mask`` that hides its second token (all of them when ``hidden(position)``), and
    ``logprobs`` near the tiny model's own (about -10.8), one of them None (vLLM could not score it)."""

    EOS = 2  # the tiny model's EOS and padding token
    FIRST_ID = 1000

    def __init__(self, tokenizer, n, truncated=lambda pos: False, hidden=lambda pos: False):
        self.tokenizer, self.n, self.truncated, self.hidden = tokenizer, n, truncated, hidden
        self.position, self.env_mask, self.logprobs = {}, {}, {}  # by first token id
        self.next_id = self.FIRST_ID

    def __call__(self, prompts, trainer):
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        for r, prompt in enumerate(prompts):
            pos, first = r % self.n, self.next_id
            self.next_id += 10
            ids = [first + j for j in range(2 + r % 3)] + ([first + 9] if self.truncated(pos) else [self.EOS])
            g = torch.Generator().manual_seed(first)
            logprobs = (-10.8 + 1.2 * (torch.rand(len(ids), generator=g) - 0.5)).tolist()
            if pos == 1:
                logprobs[0] = None
            env_mask = [0] * len(ids) if self.hidden(pos) else [1, 0] + [1] * (len(ids) - 2)
            out["prompt_ids"].append(self.tokenizer(prompt)["input_ids"])
            for key, value in (("completion_ids", ids), ("logprobs", logprobs), ("env_mask", env_mask)):
                out[key].append(value)
            self.position[first], self.env_mask[first], self.logprobs[first] = pos, env_mask, logprobs
        return out

    def reward_by_position(self, values):
        """A reward function: ``values[position]`` for each completion (None: not scorable)."""

        def reward(completion_ids, **_):
            return [values[self.position[ids[0]]] for ids in completion_ids]

        return reward


def _rollout(tiny_model_dir, n, **script):
    return ScriptedRollout(AutoTokenizer.from_pretrained(tiny_model_dir), n, **script)


def _loss_rows(rec, rollout):
    """Per loss call: the trained completions as (first token id, position in its group)."""
    return [[(int(ids[0]), rollout.position[int(ids[0])]) for ids in inputs["completion_ids"]] for inputs in rec.losses]


def _groups(inputs, rows, n=4):
    """The loss call's completions by group: {group: [(position, advantage, has a token to train on)]}."""
    mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
    groups = defaultdict(list)
    for (first, pos), adv, trains in zip(rows, inputs["advantages"].tolist(), mask.any(1).tolist()):
        groups[(first - ScriptedRollout.FIRST_ID) // 10 // n].append((pos, adv, trains))
    return groups


@pytest.mark.parametrize("m,truncated,kept", [(2, {0}, [0.0, 1.0]), (3, {0, 1}, [0.0, 1.0, 1.0])])
def test_truncated_completions_are_kept_only_when_a_group_is_short(make_trainer, tiny_model_dir, m, truncated, kept):
    """``mask_truncated_completions=True``: TRL scores a truncated completion but masks its tokens.
    Rewards 0, 0, 1, 1 by position and the first one(s) truncated: max-variance's low end would be
    the truncated 0; selection takes an untruncated 0 when there is one (m = 2), and keeps a
    truncated one only to fill m (m = 3, two untruncated). Advantages follow TRL's formula over
    the m selected."""
    rewards = [0.0, 0.0, 1.0, 1.0]
    rollout = _rollout(tiny_model_dir, 4, truncated=lambda pos: pos in truncated)
    rec = Recorder()
    trainer = make_trainer(PODSTrainer, rollout.reward_by_position(rewards), rollout_func=rollout, num_generations=4,
                           pods_m=m, per_device_train_batch_size=8, mask_truncated_completions=True)
    rec.attach(trainer).train()
    short = max(0, m - (4 - len(truncated)))  # truncated completions that must fill m
    assert len(rec.losses) == 2
    for inputs, rows in zip(rec.losses, _loss_rows(rec, rollout)):
        groups = _groups(inputs, rows)
        assert len(groups) == 2
        for chosen in groups.values():
            assert sorted(rewards[pos] for pos, _, _ in chosen) == kept
            assert [trains for pos, _, trains in chosen] == [pos not in truncated for pos, _, _ in chosen]
            assert sum(pos in truncated for pos, _, _ in chosen) == short
            r = torch.tensor([rewards[pos] for pos, _, _ in chosen])
            expected = (r - r.mean()) / (r.std() + 1e-4)
            assert torch.allclose(torch.tensor([adv for _, adv, _ in chosen]), expected, atol=1e-5)
    logged = [row["pods/selected_frac_ineligible"] for row in trainer.state.log_history if "pods/selected_reward" in row]
    assert logged == [pytest.approx(short / m)] * 2


def test_reward_functions_are_told_which_completions_were_cut(make_trainer, tiny_model_dir):
    """Every reward function gets ``truncated``, as TRL's own test decides it (the last id neither
    an end of sequence nor padding): the scripted rollout cuts positions 1 and 3 of each group."""
    rollout = _rollout(tiny_model_dir, 4, truncated=lambda pos: pos in (1, 3))
    seen = []

    def reward(completion_ids, truncated, **_):
        seen.extend((rollout.position[ids[0]], cut) for ids, cut in zip(completion_ids, truncated))
        return [float(rollout.position[ids[0]] >= 2) for ids in completion_ids]

    trainer = make_trainer(PODSTrainer, reward, rollout_func=rollout, num_generations=4, pods_m=2,
                           per_device_train_batch_size=8)
    trainer.train()
    assert seen and all(cut == (pos in (1, 3)) for pos, cut in seen)


def test_an_unscorable_completion_does_not_take_a_scorable_ones_place(make_trainer, tiny_model_dir):
    """Rewards 0, 1, None, 0.5 by position, m = 3: the three scorable completions are trained."""
    rollout = _rollout(tiny_model_dir, 4)
    rec = Recorder()
    trainer = make_trainer(PODSTrainer, rollout.reward_by_position([0.0, 1.0, None, 0.5]), rollout_func=rollout,
                           num_generations=4, pods_m=3, per_device_train_batch_size=8)
    rec.attach(trainer).train()
    assert len(rec.losses) == 2
    for inputs, rows in zip(rec.losses, _loss_rows(rec, rollout)):
        groups = _groups(inputs, rows)
        assert len(groups) == 2 and all(sorted(pos for pos, _, _ in g) == [0, 1, 3] for g in groups.values())


def test_an_infinite_reward_is_one_clear_error(make_trainer):
    def with_inf(completion_ids, **_):
        return [math.inf if i == 5 else 0.5 for i in range(len(completion_ids))]

    trainer = make_trainer(PODSTrainer, [varied, with_inf], num_generations=4, pods_m=2, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="reward function 'with_inf' returned an infinite reward"):
        trainer.train()


def test_rollout_func_fields_are_down_sampled_with_the_selection(make_trainer, tiny_model_dir):
    """A rollout_func returning ``env_mask`` (TRL's tool_mask) and ``logprobs`` (its
    sampling_per_token_logps), on the CPU. Rewards 1, 0, 0.25, 0.75 by position, but the first
    completion's env_mask hides all of it: it cannot train, so max-variance keeps 0 and 0.75
    (positions 1 and 3). Each kept row's tool mask and sampling log-probabilities are its own,
    and the token count that normalises the loss is over the kept rows' trained tokens."""
    rollout = _rollout(tiny_model_dir, 4, hidden=lambda pos: pos == 0)
    rec = Recorder()
    trainer = make_trainer(PODSTrainer, rollout.reward_by_position([1.0, 0.0, 0.25, 0.75]), rollout_func=rollout,
                           num_generations=4, pods_m=2, per_device_train_batch_size=8)
    rec.attach(trainer).train()
    assert len(rec.losses) == 2
    for inputs, rows in zip(rec.losses, _loss_rows(rec, rollout)):
        assert all(sorted(pos for pos, _, _ in g) == [1, 3] for g in _groups(inputs, rows).values())
        for i, (first, _) in enumerate(rows):
            length = int(inputs["completion_mask"][i].sum())
            assert inputs["tool_mask"][i, :length].tolist() == rollout.env_mask[first]
            expected = torch.tensor([math.nan if x is None else x for x in rollout.logprobs[first]])
            assert torch.allclose(inputs["sampling_per_token_logps"][i, :length], expected, equal_nan=True)
        trained = inputs["completion_mask"] * inputs["tool_mask"]
        assert int(inputs["num_items_in_batch"]) == int(trained.sum())


def _pretend_vllm(trainer):
    """``use_vllm`` on after construction: with a rollout_func supplying completions and their
    sampling log-probabilities, TRL then applies vLLM's importance-sampling correction, no vLLM
    needed (the weight sync it would do at this step is marked done)."""
    trainer.use_vllm, trainer._last_loaded_step = True, trainer.state.global_step


def _move_off_the_reference(model, lora):
    """Perturb the policy (LoRA: its adapter's B matrices, zero at first) so that it differs from
    the reference model, the same way in every trainer."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not lora or "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("mode,lora", [("token_truncate", False), ("sequence_mask", True)])  # every branch
def test_no_grad_forwards_run_for_the_kept_rows_with_trls_values(make_trainer, tiny_model_dir, mode, lora):
    """beta > 0, steps_per_generation > gradient_accumulation_steps and vLLM's importance sampling:
    GRPOTrainer computes the old policy's and the reference model's log-probabilities of all n
    completions before scoring them; PODSTrainer of the m kept only. On the kept rows, its old and
    reference log-probabilities, importance-sampling ratios and ``sampling/*`` logs are TRL's."""
    n, m = 4, 2
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    common = dict(num_generations=n, per_device_train_batch_size=4, steps_per_generation=2, beta=0.1,
                  vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.6,
                  vllm_importance_sampling_clip_max=1.6, peft_config=peft)
    inputs = [{"prompt": p} for p in PROMPTS[:2] for _ in range(n)]  # one generation batch: 2 groups of n
    outputs, forwarded, sampling_logs = {}, {}, {}
    for cls in (GRPOTrainer, PODSTrainer):
        rollout = _rollout(tiny_model_dir, n)
        trainer = make_trainer(cls, rollout.reward_by_position([0.0, 1.0, 0.25, 0.75]), rollout_func=rollout,
                               **common, **({"pods_m": m} if cls is PODSTrainer else {}))
        _pretend_vllm(trainer)
        _move_off_the_reference(trainer.model, lora)
        rows, inner = [], trainer._get_per_token_logps_and_entropies

        def counted(model, input_ids, *args, _rows=rows, _inner=inner, **kwargs):
            out = _inner(model, input_ids, *args, **kwargs)
            if out[0] is not None:  # a forward that ran
                _rows.append(input_ids.shape[0])
            return out

        trainer._get_per_token_logps_and_entropies = counted
        trainer.model.train()
        outputs[cls] = trainer._generate_and_score_completions(inputs)
        forwarded[cls] = rows
        sampling_logs[cls] = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("sampling/")}
    assert forwarded == {GRPOTrainer: [2 * n, 2 * n], PODSTrainer: [2 * m, 2 * m]}  # old policy, reference

    grpo, pods = outputs[GRPOTrainer], outputs[PODSTrainer]
    row_of = {int(ids[0]): i for i, ids in enumerate(grpo["completion_ids"])}
    kept = [row_of[int(ids[0])] for ids in pods["completion_ids"]]
    assert len(kept) == 2 * m
    tokens = pods["completion_mask"].bool()  # [2m, C'] (C' <= C: trimmed to the kept rows)
    width = tokens.shape[1]
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        assert torch.allclose(pods[key][tokens], grpo[key][kept, :width][tokens], atol=1e-5), key
    assert not torch.allclose(pods["old_per_token_logps"][tokens], pods["ref_per_token_logps"][tokens], atol=1e-3)
    ratio = grpo["importance_sampling_ratio"][kept]
    if mode.startswith("token"):
        ratio = ratio[:, :width]
    assert torch.allclose(pods["importance_sampling_ratio"], ratio, atol=1e-5)
    assert (ratio != 1).any() and (ratio == (0.0 if mode.endswith("mask") else 1.6)).any()  # corrected, and clipped

    trained = (grpo["completion_mask"] * grpo["tool_mask"])[kept].bool()
    delta = (grpo["old_per_token_logps"] - grpo["sampling_per_token_logps"])[kept].abs()[trained]
    delta = delta[~delta.isnan()]
    ratios = ratio.flatten() if mode.startswith("sequence") else ratio[trained[:, : ratio.shape[1]]]
    expected = {"sampling/sampling_logp_difference/mean": delta.mean(), "sampling/sampling_logp_difference/max": delta.max(),
                "sampling/importance_sampling_ratio/min": ratios.min(), "sampling/importance_sampling_ratio/mean": ratios.mean(),
                "sampling/importance_sampling_ratio/max": ratios.max()}
    assert sampling_logs[PODSTrainer] == pytest.approx({k: v.item() for k, v in expected.items()}, abs=1e-5)


def test_import_without_trl_names_the_install_command():
    code = ("import sys\nsys.modules['trl'] = None  # as if TRL were not installed\n"
            "try:\n    import podsrl.integrations.trl\nexcept ImportError as e:\n    print(type(e).__name__, e)\n")
    run = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == f"ImportError podsrl.integrations.trl needs TRL (trl>=1.16,<1.17): {install_command('trl')}"


@pytest.fixture
def tiny_vlm_config():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    text = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14, projection_dim=16)
    return LlavaConfig(text_config=text, vision_config=vision)


@pytest.mark.parametrize("given", ["path", "model", "processor"])
def test_vision_language_models_are_refused_before_anything_is_loaded(tmp_path, tiny_model_dir, tiny_vlm_config,
                                                                     monkeypatch, given):
    """A vision-language model given by path (a configuration, no weights), as a model, or through
    a processor as processing class: refused before GRPOTrainer.__init__ (which loads the model,
    its reference copy and any vLLM engine) runs. A text model's configuration is not refused."""
    from transformers import CLIPImageProcessorPil, LlavaForConditionalGeneration, LlavaProcessor

    def load(*_, **__):
        raise AssertionError("GRPOTrainer.__init__ ran: the model (and any vLLM engine) would be loaded")

    monkeypatch.setattr(GRPOTrainer, "__init__", load)
    args = PODSConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", num_generations=4,
                      per_device_train_batch_size=4, pods_m=2)
    processing = None
    if given == "path":
        tiny_vlm_config.save_pretrained(tmp_path / "vlm")
        model = str(tmp_path / "vlm")
    elif given == "model":
        model = LlavaForConditionalGeneration(tiny_vlm_config)
    else:
        model = tiny_model_dir
        processing = LlavaProcessor(image_processor=CLIPImageProcessorPil(),
                                    tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(ValueError, match="does not support vision-language models"):
        PODSTrainer(model=model, reward_funcs=varied, args=args, processing_class=processing)
    assert not pods_trl.is_vision_language(tiny_model_dir, None, args)


@pytest.mark.slow
def test_the_guides_example_runs_as_written_offline_with_the_two_lines_changed(tmp_path):
    """docs/trl.md's script, with its diff applied and one step instead of 50, on a CPU without a
    network: it trains, and neither deepspeed's nor transformers' known noise is printed."""
    import re

    guide = (REPO / "docs" / "trl.md").read_text()
    script = re.findall(r"```python\n(.*?)```", guide, re.S)[0]
    diff = re.findall(r"```diff\n(.*?)```", guide, re.S)[0].splitlines()
    for old, new in zip([l[1:] for l in diff if l.startswith("-")], [l[1:] for l in diff if l.startswith("+")]):
        assert old in script
        script = script.replace(old, new)
    assert "PODSTrainer(" in script and "pods_m=4" in script
    script = script.replace("max_steps=50", "max_steps=1")
    (tmp_path / "example.py").write_text(script)
    env = {**subprocess_env(), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "runs" / "arithmetic").is_dir()
    output = run.stdout + run.stderr
    assert "FutureWarning" not in output and "unable to detect it" not in output, output[-3000:]
