"""Typed configuration: dataclasses (the schema and its defaults), YAML files and dotted
``key=value`` overrides merged by OmegaConf, then the cross-field checks in :func:`validate`.

The defaults are the embedded CPU run: SmolLM2-135M-Instruct learning single-digit addition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from podsrl.errors import PodsError


@dataclass
class ModelConfig:
    name_or_path: str = "smollm2"
    """Hugging Face hub id, local folder, ``.gguf`` file, or ``smollm2`` (the embedded default)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype."""
    trust_remote_code: bool = False
    lora_r: int = 0
    """LoRA rank; 0 trains every weight (full fine-tuning)."""
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward instead of keeping them (TRL's default
    too): a second forward per update for a fraction of the activation memory."""
    load_in_4bit: bool = False
    """NF4 base weights through bitsandbytes under LoRA (QLoRA); needs a CUDA GPU and
    ``pip install 'podsrl[qlora]'``."""


@dataclass
class TaskConfig:
    name: Literal["arithmetic", "gsm8k", "math500"] = "arithmetic"
    path: str | None = None
    """gsm8k/math500: a jsonl file, a folder with ``train.jsonl``/``test.jsonl``, or a hub name."""
    train_path: str | None = None
    """math500 only: MATH-style training problems (jsonl); default: the test problems."""
    digits: int = 1
    """arithmetic: operands have up to this many digits."""
    operations: str = "+"
    """arithmetic: operators drawn from ``+-*``."""
    test_size: int = 200
    """Held-out problems evaluated; 0 = all."""
    system_prompt: str | None = None
    """Replaces the task's system prompt."""


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    temperature: float = 0.9
    top_p: float = 1.0
    max_new_tokens: int = 12
    batch_size: int | None = None
    """HF engine: sequences decoded together; default 1024 on a GPU, 128 on a CPU."""
    share_prompt_cache: bool = True
    """HF engine: prefill each prompt once and share its KV cache among its n rollouts."""
    decoder: Literal["loop", "generate", "static"] = "loop"
    """HF engine: ``loop`` drops each row from the batch as soon as it ends; ``generate`` runs
    transformers' generate (every row until the last one ends); ``static``, generate with a static
    KV cache, compiled with CUDA graphs on a GPU."""
    gpu_memory_utilization: float = 0.3
    """vLLM: fraction of GPU memory for its weights and KV cache (the rest trains); on vLLM's CPU
    build, the fraction of the machine's memory, when ``kv_cache_mb`` is not set."""
    kv_cache_mb: int | None = None
    """vLLM: its KV cache in MiB, instead of what ``gpu_memory_utilization`` leaves; it bounds the
    tokens in flight, and the longest prompt plus ``max_new_tokens`` must fit in it."""
    sleep: bool = False
    """vLLM on a CUDA GPU: release its memory during the update (sleep mode) and wake for the next
    rollout."""


@dataclass
class Config:
    output_dir: str | None = None
    """Run folder; default: a fresh ``runs/<task>-<mode>-<time>`` under the working directory."""
    seed: int = 0
    mode: Literal["pods", "grpo", "grpo-ga"] = "pods"
    """pods: train m of n per prompt; grpo: train all n (n = m); grpo-ga: all n, accumulating
    gradients over micro-batches of m rollouts per prompt."""
    steps: int = 16
    """Optimizer steps."""
    prompts_per_step: int = 4
    n: int = 16
    """Rollouts generated per prompt."""
    m: int = 4
    """Rollouts per prompt in the update (pods), or per micro-batch (grpo-ga); unused by grpo."""
    rule: str = "max_variance"
    """Down-sampling rule (podsrl.downsample.RULES)."""
    rewards: list[str] = field(default_factory=lambda: ["accuracy"])
    """Reward names (podsrl.rewards.REWARDS) or ``module:function`` paths."""
    reward_weights: list[float] = field(default_factory=lambda: [1.0])
    reward_workers: int | None = None
    """Worker processes that score rollouts (math-verify, users' functions); default: the CPU
    cores this process may use; 0: score in the training process, without a time bound."""
    reward_timeout_s: float = 1.0
    """Wall-time bound on one completion's scoring by one reward function; past it the
    completion scores 0 and counts in the ``reward_timeouts`` metric."""
    scale_rewards: Literal["group", "none"] = "group"
    """group: divide advantages by the group's std (GRPO); none: only centre (Dr. GRPO)."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo"] = "grpo"
    lr: float = 3e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    beta: float = 0.0
    """KL weight to the reference (base) policy; 0 disables it."""
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    skip_zero_advantage: bool = True
    """With beta = 0, rollouts whose advantage is exactly 0 (all-equal groups) skip the forward and
    backward: they add nothing to the gradient, and the loss's normalisers still count them."""
    lean_logprobs: bool = True
    """Per-token log-probs chunk by chunk from the hidden states, never the full [N, T, V] logits
    (falls back to full logits under FSDP / DeepSpeed or for an unusual output layer)."""
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    """Autocast through accelerate (weights stay in model.dtype); default: the launcher's setting."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward; default: every trained sequence at once (grpo, pods), or
    m x prompts (grpo-ga)."""
    eval_every: int = 0
    """Evaluate every K steps (0: only before the first step and at the end)."""
    eval_every_s: float = 0.0
    """Also evaluate each time the training clock passes another multiple of this (0: off);
    comparisons of methods with different step costs use it."""
    eval_temperature: float = 0.0
    """0: greedy pass@1."""
    save_every: int = 0
    """Checkpoint every K steps (0: only at the end)."""
    resume: bool = False
    """Continue from the latest checkpoint in output_dir."""
    time_budget_s: float = 0.0
    """Stop once the training clock (evaluation excluded) passes this many seconds (0: none)."""
    report_to: list[str] = field(default_factory=list)
    """accelerate trackers: tensorboard, wandb, trackio, ..."""
    log_completions: int = 0
    """Each step, write the first K rollouts (the first prompts' groups) with their rewards, whether
    they were selected and their advantages to ``completions.jsonl`` in output_dir, and at each
    evaluation the first K held-out completions, with whether each was correct, to
    ``eval_completions.jsonl`` (``podsrl eval`` prints them); 0: off."""
    progress: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


def load_config(path: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file, then ``key=value`` overrides; unknown keys are errors."""
    try:
        merged = OmegaConf.structured(Config)
        if path is not None:
            if not Path(path).is_file():
                raise PodsError(f"config file not found: {path}")
            merged = OmegaConf.merge(merged, _read_yaml(path))
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise PodsError(f"overrides must be key=value, got {bad[0]!r}")
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise PodsError(_config_message(e)) from None
    validate(config)
    return config


def _read_yaml(path: str):
    """The mapping a YAML config file holds; a syntax error names its line."""
    import yaml

    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise PodsError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or _first_line(e)})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PodsError(f"cannot read config file {path}: {e}") from None
    if not isinstance(loaded, DictConfig):
        raise PodsError(f"{path}: the top level must be a mapping of config keys, not a list")
    return loaded


def _first_line(e: Exception) -> str:
    return (str(e).strip() or type(e).__name__).splitlines()[0]


def _config_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0]
    if "not in struct" in first or "Key '" in first and "not" in first:
        return f"unknown config key {key!r}"
    return f"bad config value for {key!r}: {first}" if key else f"bad config: {first}"


def validate(c: Config) -> None:
    """Cross-field checks, in one place."""
    from podsrl.downsample import RULES

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise PodsError(message)

    need(c.n >= 1 and c.prompts_per_step >= 1, "n and prompts_per_step must be >= 1")
    need(c.steps >= 1, f"steps must be >= 1, got {c.steps}; podsrl eval evaluates a model without training")
    need(1 <= c.m <= c.n, f"m must be in 1..n, got m={c.m}, n={c.n}")
    need(c.rule in RULES, f"unknown rule {c.rule!r}; known: {', '.join(sorted(RULES))}")
    need(len(c.rewards) == len(c.reward_weights), "rewards and reward_weights need the same length")
    need(c.reward_workers is None or c.reward_workers >= 0, "reward_workers must be >= 0")
    need(c.reward_timeout_s > 0, "reward_timeout_s must be > 0")
    need(c.lr > 0 and c.rollout.max_new_tokens >= 1, "lr and rollout.max_new_tokens must be positive")
    need(c.rollout.temperature > 0, "rollout.temperature must be > 0 (RL needs sampled rollouts)")
    need(c.micro_batch_size is None or c.micro_batch_size >= 1, "micro_batch_size must be >= 1")
    need(c.log_completions >= 0, "log_completions must be >= 0")
    need(c.model.lora_r >= 0, "model.lora_r must be >= 0")
    need(not c.model.load_in_4bit or c.model.lora_r > 0, "model.load_in_4bit needs LoRA (model.lora_r > 0): 4-bit weights do not train")
    need(0 < c.rollout.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization must be in (0, 1]")
    need(c.rollout.kv_cache_mb is None or c.rollout.kv_cache_mb >= 1, "rollout.kv_cache_mb must be >= 1")
    need(not (c.model.load_in_4bit and c.rollout.engine == "vllm"),
         "model.load_in_4bit works with rollout.engine=hf; vLLM would need the unquantised weights")
    need(c.task.name == "arithmetic" or c.task.path is not None, f"task {c.task.name} needs task.path")


def trained_per_prompt(c: Config) -> int:
    """Rollouts per prompt that reach the update."""
    return c.m if c.mode == "pods" else c.n


def to_dict(c: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(c))


def to_yaml(c: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(c))
