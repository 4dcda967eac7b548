"""Typed configuration: dataclasses (the schema and its defaults), YAML files and dotted
``key=value`` overrides merged by OmegaConf, then the cross-field checks in :func:`validate`.

The defaults are the embedded CPU run: SmolLM2-135M-Instruct learning single-digit addition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from podsrl.errors import PodsError, first_line


@dataclass
class ModelConfig:
    """The policy: which model, its dtype, LoRA and memory settings (keys ``model.*``)."""

    name_or_path: str = "smollm2"
    """Hugging Face hub id, local folder, ``.gguf`` file, or ``smollm2`` (the embedded default)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype."""
    trust_remote_code: bool = False
    """Let transformers run the model repository's own code (``trust_remote_code``)."""
    lora_r: int = 0
    """LoRA rank; 0 trains every weight (full fine-tuning)."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by ``lora_alpha / lora_r``."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapter's input, in [0, 1)."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters (peft's ``target_modules``); ``["all-linear"]``: every linear layer
    but the output layer."""
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward instead of keeping them (TRL's default
    too): a second forward per update for a fraction of the activation memory."""
    load_in_4bit: bool = False
    """NF4 base weights through bitsandbytes under LoRA (QLoRA; ``podsrl eval`` also without LoRA);
    ``pip install -e '.[qlora]'``. On a CUDA GPU, or on the CPU with bitsandbytes' CPU kernels
    (computing in float32 there; every quantised layer's input width a multiple of their 4-bit
    block of 64 weights)."""


@dataclass
class TaskConfig:
    """The task: training prompts, gold answers and the held-out test set (keys ``task.*``)."""

    name: Literal["arithmetic", "gsm8k", "math500", "gym"] = "arithmetic"
    """``arithmetic`` (generated from the seed, nothing to download), ``gsm8k``, ``math500``, or
    ``gym``: one of reasoning-gym's generators (``pip install -e '.[gym]'``; ``podsrl tasks``
    lists them), endless and offline, its own verifier as the accuracy reward."""
    path: str | None = None
    """gsm8k/math500: a jsonl file, a folder with ``train.jsonl``/``test.jsonl``, or a hub name."""
    train_path: str | None = None
    """math500 only: MATH-style training problems (jsonl); default: the test problems."""
    digits: int = 1
    """arithmetic: operands have up to this many digits."""
    operations: str = "+"
    """arithmetic: operators drawn from ``+-*``."""
    dataset: str | None = None
    """gym: the reasoning-gym data set (``chain_sum``, ``letter_counting``, ...)."""
    config: dict[str, Any] = field(default_factory=dict)
    """gym: the data set's generator settings, e.g. ``{min_terms: 2, max_terms: 3, max_digits: 2}``
    (on the command line ``task.config.max_terms=3``); default: reasoning-gym's."""
    datasets: list[dict[str, Any]] = field(default_factory=list)
    """gym, instead of ``dataset``: a weighted mix (reasoning-gym's composite), each item
    ``{name: ..., weight: 1.0, config: {...}}``; a problem comes from a data set with probability
    proportional to its weight."""
    test_size: int = 200
    """Held-out problems evaluated (at most those the test file holds); 0 = all of gsm8k's or
    math500's (arithmetic needs a number; gym: at least 1, drawn with distinct questions)."""
    system_prompt: str | None = None
    """Replaces the task's system prompt; an empty one is an empty system message."""
    require_marker: bool = False
    """The accuracy reward pays only an answer the completion marks (``\\boxed{}``, answer tags,
    an answer line, ``####``), never the last number of an unmarked completion."""


@dataclass
class RolloutConfig:
    """Rollout generation: the engine and its sampling settings (keys ``rollout.*``)."""

    engine: Literal["hf", "vllm"] = "hf"
    """``hf``: the training model itself generates; ``vllm``: a vLLM engine in each training process
    (``pip install -e '.[vllm]'``), given the policy's weights after every update."""
    temperature: float = 0.9
    """Sampling temperature of the rollouts (> 0; evaluation uses ``eval_temperature``)."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches ``top_p``."""
    max_new_tokens: int = 12
    """Most tokens generated per completion, in training and in evaluation."""
    batch_size: int | None = None
    """HF engine: sequences decoded together; default 1024 on a GPU, 128 on a CPU."""
    share_prompt_cache: bool = True
    """HF engine: prefill each prompt once and share its KV cache among its n rollouts."""
    decoder: Literal["auto", "loop", "generate", "static"] = "auto"
    """HF engine: ``loop`` drops each row from the batch as soon as it ends; ``generate`` runs
    transformers' generate (every row until the last one ends); ``static``, generate with a static
    KV cache, compiled with CUDA graphs on a GPU; ``auto``: ``static`` on a CUDA GPU for generate
    calls of at most 512 rows (prompts per call x n; ``podsrl.rollout.hf.STATIC_MAX_ROWS``), else
    ``loop`` (always ``loop`` on a CPU)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: fraction of GPU memory for its weights and KV cache (the rest trains); on vLLM's CPU
    build, the fraction of the machine's memory, when ``kv_cache_mb`` is not set."""
    kv_cache_mb: int | None = None
    """vLLM: its KV cache in MiB, instead of what ``gpu_memory_utilization`` leaves; it bounds the
    tokens in flight, and the longest prompt plus ``max_new_tokens`` must fit in it."""
    sleep: bool = False
    """vLLM on a CUDA GPU: release its memory during the update (sleep mode) and wake for the next
    rollout."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """vLLM: the dtype of its weights and KV cache; ``auto``: bfloat16 on a CUDA GPU (float16 on
    one without bf16), the policy's dtype on a CPU. The policy's weights are cast as they are pushed;
    the importance-sampling correction (``vllm_importance_sampling_correction``) weighs what the
    lower precision changes."""


CISPO_CAP = 5.0
"""loss_type=cispo's default cap of the importance ratio (``epsilon_high``): the value TRL's
documentation recommends, after ScaleRL (arXiv 2510.13786)."""


@dataclass
class Config:
    """A run: the algorithm, the optimizer, rewards, evaluation and checkpoints (top-level keys),
    with the model, the task and the rollouts as ``model.*``, ``task.*`` and ``rollout.*``."""

    output_dir: str | None = None
    """Run folder; default: a fresh ``runs/<task>-<mode>-<time>`` under the working directory."""
    seed: int = 0
    """Seeds the prompt order, the arithmetic problems and every rollout (from ``(seed, step,
    prompt)``), so a run repeats and resumes exactly."""
    mode: Literal["pods", "grpo", "grpo-ga"] = "pods"
    """pods: train m of n per prompt; grpo: train all n (n = m); grpo-ga: all n, accumulating
    gradients over micro-batches of m rollouts per prompt."""
    steps: int = 16
    """Optimizer steps."""
    prompts_per_step: int = 4
    """Prompts per optimizer step (over all processes; it must divide evenly among them)."""
    n: int = 16
    """Rollouts generated per prompt (>= 2)."""
    m: int = 4
    """Rollouts per prompt in the update (pods, >= 2), or per micro-batch (grpo-ga); grpo trains all n
    (m = n, or m left out)."""
    rule: str = "max_variance"
    """Down-sampling rule (podsrl.downsample.RULES)."""
    adaptive_n: bool = False
    """pods with rule=max_variance: generate each prompt's rollouts in rounds of ``adaptive_round`` and stop a prompt once
    more rollouts cannot change the rewards it trains on (it holds m/2 rewards at each end of the
    rewards' declared range: for 0/1 rewards, m/2 of each value); ``n`` is then the most a prompt
    takes (podsrl.sampling). Each reward function must declare its ``bounds``."""
    adaptive_round: int | None = None
    """adaptive_n: rollouts per prompt in each round; default m."""
    prompt_filter: Literal["none", "history"] = "none"
    """history: before generating, skip a prompt whose latest groups all had equal rewards, with a
    probability that grows with each such group and never reaches 1 (GRESO); a skipped prompt is
    replaced by the next of the stream, so a step still trains prompts_per_step prompts."""
    prompt_filter_target: float = 0.25
    """history: the fraction of all-equal groups per step that the skip probability is tuned toward."""
    dynamic_sampling: bool = False
    """DAPO's filter (verl's filter_groups): groups whose rewards are all equal are dropped after
    scoring, and further prompts are drawn and generated until the step has prompts_per_step
    groups with signal, at most ``dynamic_sampling_rounds`` batches of prompts."""
    dynamic_sampling_rounds: int = 10
    """dynamic_sampling: batches of prompts a step may draw; past it the step fills up with
    dropped groups (in the order drawn)."""
    rewards: list[str] = field(default_factory=lambda: ["accuracy"])
    """Reward names (podsrl.rewards.REWARDS) or ``module:function`` paths."""
    reward_weights: list[float] = field(default_factory=lambda: [1.0])
    """One weight per entry of ``rewards``; a rollout's reward is the weighted sum."""
    reward_workers: int | None = None
    """Worker processes that score rollouts (math-verify, users' functions); default: the CPU
    cores this process may use; 0: score in the training process, without a time bound."""
    reward_timeout_s: float = 1.0
    """Bound on one completion's scoring by one reward function, in CPU seconds of its worker
    (the scoring itself, not the time a worker waits for a core on a busy machine). Past it, or
    past ``reward_wall_timeout_s``, the completion is scored once more; past a bound again it
    scores 0 and counts in the ``reward_timeouts`` metric (shown on the console and the bar)."""
    reward_wall_timeout_s: float = 30.0
    """Wall-time bound on one completion's scoring, from the moment a worker takes it: catches a
    reward that waits rather than computes (a sleep, a lock, the network)."""
    reward_memory_mb: int = 0
    """Memory a reward worker may allocate beyond what it holds when it starts (0: no cap); a
    worker that exceeds it is replaced and the completion scores 0, counted like a timeout."""
    scale_rewards: Literal["group", "none"] = "group"
    """group: divide advantages by the group's std (GRPO); none: only centre (Dr. GRPO)."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"] = "grpo"
    """TRL's loss types (podsrl.loss_terms), under TRL's meanings: ``grpo``, the clipped surrogate
    averaged per sequence then over sequences (the PODS paper's; TRL's default is ``dapo``);
    ``dapo``, over every token of the optimizer batch; ``bnpo``, each micro-batch's token mean
    divided by the accumulation steps; ``dr_grpo``, summed and divided by sequences × max
    completion length; ``cispo``, the clipped weight detached times the log-prob (epsilon_high is
    its cap, ~5); ``sapo``, a soft gate for the clip; ``luspo``, per-sequence sums (with
    importance_sampling_level=sequence); ``vespo``, a Gamma weight of the sequence's ratio."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """The importance weight of the policy against the one that generated: per ``token``, or one per
    ``sequence``, the exponential of its tokens' mean log-ratio (GSPO). loss_type=vespo weighs whole
    sequences itself and reads it only for the KL's weight (beta > 0, use_bias_correction_kl); TRL
    warns of it there, podsrl refuses it otherwise."""
    num_iterations: int = 1
    """μ: optimizer steps over each step's selected rollouts (TRL's ``num_iterations``); the old
    policy's log-probs are taken once, before the first, so that from the second on the ratio
    moves off 1 and ``epsilon_low``/``epsilon_high`` clip it. 1: no extra forward pass."""
    sapo_temperature_pos: float = 1.0
    """loss_type=sapo: the gate's temperature for positive advantages."""
    sapo_temperature_neg: float = 1.05
    """loss_type=sapo: the gate's temperature for the others."""
    vespo_k_pos: float = 2.0
    """loss_type=vespo: the Gamma weight's power k for advantages >= 0."""
    vespo_lambda_pos: float = 3.0
    """loss_type=vespo: the Gamma weight's decay λ for advantages >= 0, > 0 (TRL clamps it to 1e-4)."""
    vespo_k_neg: float = 3.0
    """loss_type=vespo: k for negative advantages."""
    vespo_lambda_neg: float = 2.0
    """loss_type=vespo: λ for negative advantages, > 0."""
    lr: float = 3e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the gradient's global norm to this (0: no clipping)."""
    beta: float = 0.0
    """KL weight to the reference (base) policy; 0 disables it."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the importance weight (DeepSeek-V3.2; TRL's default): its gradient
    is then the unbiased reverse-KL gradient; on-policy its value is unchanged. Only with beta > 0
    (TRL ignores it at beta = 0; podsrl refuses it there)."""
    epsilon_low: float = 0.2
    """Lower clip range of the importance ratio: ``1 - epsilon_low``, in [0, 1) (TRL's ``epsilon``);
    the clipped loss types' only (grpo, bnpo, dr_grpo, dapo, luspo): refused with the others."""
    epsilon_high: float | None = None
    """Upper clip range of the importance ratio: ``1 + epsilon_high`` (DAPO's clip-higher when larger
    than ``epsilon_low``); default: ``epsilon_low``, as in TRL. With loss_type=cispo the cap of the
    ratio itself (TRL's meaning), default 5.0, the value TRL recommends after ScaleRL (TRL's own
    fallback, epsilon = 0.2, would cap even the on-policy ratio 1). Refused with sapo and vespo,
    which have no clip (TRL accepts it there and ignores it)."""
    vllm_importance_sampling_correction: bool = True
    """rollout.engine=vllm: weight each token's loss by the ratio π_old / μ of the policy's
    probability to vLLM's (other kernels, often another precision: bf16, CUDA graphs), as TRL
    does, per token or per sequence and truncated or masked at the cap
    (``vllm_importance_sampling_mode``); its mean, the share of tokens past the cap, and the
    ratio's least and greatest values before the cap (per token or per sequence, as the mode) are
    logged (``sampling_ratio``, ``sampling_clipped``, ``sampling_ratio_min``,
    ``sampling_ratio_max``). With ``async_lag`` the
    same correction, μ the lagged policy that sampled. The HF engine of a synchronous run samples
    from the policy itself."""
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = "sequence_mask"
    """How that ratio is formed (TRL's names and default): per token or of the whole sequence (the
    product of its tokens' ratios); past the cap truncated to it, or masked (weight 0)."""
    vllm_importance_sampling_cap: float = 3.0
    """The cap of that ratio (TRL's ``vllm_importance_sampling_clip_max``), >= 1."""
    skip_zero_advantage: bool = True
    """With beta = 0, rollouts whose advantage is exactly 0 (all-equal groups) skip the forward and
    backward: they add nothing to the gradient, and the loss's normalisers still count them."""
    lean_logprobs: bool = True
    """Per-token log-probs chunk by chunk from the hidden states, never the full [N, T, V] logits
    (falls back to full logits under FSDP or for an unusual output layer)."""
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    """Autocast through accelerate (weights stay in model.dtype); default: the launcher's setting
    (``accelerate launch`` sets one), else bf16 on a CUDA GPU that supports it, as TRL does (unless
    model.dtype is float16), and no autocast on a CPU."""
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
    save_optimizer: bool | None = None
    """Keep the optimizer state (Adam's moments, twice the trained weights' size) in checkpoints,
    so that ``resume=true`` continues exactly; default: where ``save_every`` > 0. A run resumed
    from a checkpoint without it starts a fresh optimizer, and says so."""
    resume: bool = False
    """Continue from the latest checkpoint in output_dir. Refused where a setting that changes
    the result (:func:`config_changes`) differs from the run's ``config.yaml``."""
    replay: bool = False
    """Train again, rather than drop, the steps that ``metrics.jsonl`` logs beyond where the run
    starts (its checkpoint, or step 0 where the folder holds none: a checkpoint lost or never
    saved): those steps run without evaluation, each checked against its logged record (every
    field but times and memory), and the logged records stay, their evaluations and training clock
    included; the run then goes on as a resume would. A step that differs stops the run with an
    error naming it, the folder as it was found. Checkpoints are saved from the last replayed step
    on. Refused where a result-changing setting differs from the run's ``config.yaml``; one process."""
    save_rollouts: bool = False
    """Keep every completion the run samples in ``rollouts.jsonl`` (token ids, about 10 kB a step
    for 128 completions of 40 tokens), so that ``replay=true`` trains the logged steps again on
    them, without generating: a replay then costs each step's scoring and update alone, and holds
    on another machine, whose arithmetic would sample other tokens (the records are then checked
    to a relative 1e-4 where their values are not integers). One process, ``async_lag=0``."""
    allow_config_change: bool = False
    """Resume (or let ``podsrl compare`` reuse a run) even where result-changing settings differ
    from the run's; the new values apply from the resumed step on, and the previous config is
    kept as ``config.before-step-N.yaml``."""
    time_budget_s: float = 0.0
    """Stop once the training clock (evaluation excluded) passes this many seconds (0: none)."""
    clock: Literal["wall", "cpu"] = "wall"
    """The training clock that ``time_budget_s`` and ``eval_every_s`` count: ``wall`` seconds, or
    ``cpu``, the training process's CPU seconds, which other jobs on a shared CPU machine bend far
    less (with ``threads=1``; docs/experiments/clock.md). Both are recorded in metrics.jsonl
    (``train_seconds``, ``train_cpu_seconds``); the reward workers' CPU time is not counted."""
    report_to: list[str] = field(default_factory=list)
    """accelerate trackers: tensorboard, wandb, trackio, ..."""
    log_completions: int = 0
    """Each step, write the first K rollouts (the first prompts' groups) with their rewards, whether
    they were selected and their advantages to ``completions.jsonl`` in output_dir, and at each
    evaluation the first K held-out completions, with whether each was correct, to
    ``eval_completions.jsonl`` (``podsrl eval`` prints them); 0: off."""
    progress: bool = True
    """Show a progress bar of the steps (main process only)."""
    async_lag: int = 0
    """Generate while the trainer updates (:mod:`podsrl.pipeline`): step t's rollouts are sampled,
    in a worker process with its own weights, from the policy k = ``async_lag`` updates before the
    one that trains on them (after update max(0, t - 1 - k)); 0 is the synchronous trainer, which
    samples each step from the policy it updates. The update corrects for the lag with the
    importance ratio of ``vllm_importance_sampling_correction`` (on by default). A fixed lag, not
    a best-effort stream: runs are reproducible and resume exactly. Runs on one process; the worker
    runs the configured engine (HF or vLLM). Under top-p < 1 the HF worker records the nucleus of
    each token and the ratio is taken on it (sampling replay); vLLM with top-p < 1 is refused."""
    async_worker_threads: int | None = None
    """With ``async_lag`` >= 1, the generation worker's CPU threads; default: half the cores (at
    least one). The trainer then takes ``threads``, else the cores the worker leaves."""
    threads: int | None = None
    """Threads of the training (or ``podsrl eval``'s) process's CPU kernels (torch's intra-op
    threads); default: torch's own (one per core, or ``OMP_NUM_THREADS``). On a CPU shared with
    other work, 1 is often faster: idle threads of a multi-threaded kernel wait at barriers for
    cores that are busy elsewhere. Reward workers always run one."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (:class:`ModelConfig`)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The task (:class:`TaskConfig`)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout generation (:class:`RolloutConfig`)."""

    def __post_init__(self):
        if self.epsilon_high is None:  # recorded as the value it stands for
            self.epsilon_high = CISPO_CAP if self.loss_type == "cispo" else self.epsilon_low


def load_config(path: str | None = None, overrides: list[str] = (), baseline: Config | None = None,
                defaults: dict | None = None, evaluating: bool = False) -> Config:
    """Defaults (the schema's, then ``defaults``: a nested dict of settings), then the YAML file,
    then ``key=value`` overrides (a later one of a key wins); unknown keys are errors. A value of a
    text setting is taken as written (``output_dir=010`` is the folder ``010``, not 8). A setting
    that differs from ``baseline`` (default: the defaults) is refused where it cannot apply
    (:data:`APPLIES_WITH`); ``evaluating``: the config of ``podsrl eval``, which trains nothing."""
    try:
        merged = OmegaConf.structured(Config)
        if defaults:
            merged = OmegaConf.merge(merged, defaults)
        if path is not None:
            if not Path(path).is_file():
                raise PodsError(f"config file not found: {path}")
            merged = OmegaConf.merge(merged, _read_yaml(path))
        merged = OmegaConf.merge(merged, _read_overrides(list(overrides)))
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise PodsError(_config_message(e)) from None
    validate(config, baseline, evaluating)
    return config


def check_given_once(overrides: list[str]) -> None:
    """Refuse a user's overrides that set a key twice (``n=8 n=4``): which one was meant?"""
    given = {}
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key in given:
            raise PodsError(f"{key} is given twice on the command line ({given[key]!r} and {override!r}); give it once")
        given[key] = override


def _field_type(key: str):
    """The declared type of a dotted config key; None for a key the schema lacks."""
    hint, cls = None, Config
    for part in key.split("."):
        hints = get_type_hints(cls) if is_dataclass(cls) else {}
        if part not in hints:
            return None
        hint = cls = hints[part]
    return hint


def _is_text(key: str) -> bool:
    """Whether a key holds text (``str``, ``str | None``, or a choice among strings)."""
    hint = _field_type(key)
    if hint is None:
        return False
    kinds = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, UnionType) else [hint]
    return all(k is str or (get_origin(k) is Literal and all(isinstance(v, str) for v in get_args(k))) for k in kinds)


def _text_value(key: str, raw: str):
    """A text setting's value as written: YAML's ``null`` where the key may be unset, a quoted
    string unquoted; anything else verbatim (never YAML's reading: ``010``, ``1e3``, ``yes``)."""
    import yaml

    if raw in ("null", "~") and type(None) in get_args(_field_type(key)):
        return None
    if raw[:1] in "'\"" and raw[:1] and raw[-1:] == raw[:1] and len(raw) >= 2:
        try:
            quoted = yaml.safe_load(raw)
        except yaml.YAMLError:
            quoted = None
        if isinstance(quoted, str):
            return quoted
    return raw


def _read_overrides(overrides: list[str]) -> DictConfig:
    """``key=value`` overrides as a config: text settings as written, other values read as YAML."""
    import yaml

    config = OmegaConf.create({})
    for override in overrides:
        key, eq, raw = override.partition("=")
        key = key.strip()
        if not eq or not key:
            raise PodsError(f"overrides must be key=value, got {override!r}")
        if _is_text(key):
            OmegaConf.update(config, key, _text_value(key, raw), force_add=True)
            continue
        try:
            config = OmegaConf.merge(config, OmegaConf.from_dotlist([override]))
        except yaml.YAMLError as e:
            raise PodsError(f"{override!r}: not a valid value ({getattr(e, 'problem', None) or first_line(e)})") from None
    return config


def _read_yaml(path: str):
    """The mapping a YAML config file holds, text settings as written; a syntax error names its line."""
    import yaml

    try:
        loaded = OmegaConf.load(path)
        root = yaml.compose(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise PodsError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or first_line(e)})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PodsError(f"cannot read config file {path}: {e}") from None
    if root is None:
        return OmegaConf.create({})
    if not isinstance(root, yaml.MappingNode) or not isinstance(loaded, DictConfig):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else f"the text {first_line(ValueError(root.value))[:40]!r}"
        raise PodsError(f"{path}: the top level must be a mapping of config keys, not {kind}")
    for key, node in _plain_scalars(root):
        if _is_text(key) and OmegaConf.select(loaded, key) is not None:
            OmegaConf.update(loaded, key, _text_value(key, node.value), force_add=True)
    return loaded


def _plain_scalars(node, prefix: str = ""):
    """(dotted key, node) of every unquoted scalar under a YAML mapping node."""
    import yaml

    for k, v in node.value:
        key = f"{prefix}{k.value}"
        if isinstance(v, yaml.MappingNode):
            yield from _plain_scalars(v, f"{key}.")
        elif isinstance(v, yaml.ScalarNode) and v.style is None:
            yield key, v


def _config_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0]
    if "not in struct" in first or "Key '" in first and "not" in first:
        return f"unknown config key {key!r}{_did_you_mean(key)}"
    if "is not a ListConfig" in first:
        return f"{key} must be a list, e.g. {key}=[a,b]"
    return f"bad config value for {key!r}: {first}" if key else f"bad config: {first}"


def _did_you_mean(key: str | None) -> str:
    """`` (did you mean 'lr'?)`` for the closest known key, where one is close."""
    import difflib

    known = list(flat_keys(to_dict(Config())))
    close = difflib.get_close_matches(key or "", known, n=1, cutoff=0.6)
    if not close and key and "." not in key:  # a nested key given without its section: 'lora_r'
        close = [k for k in known if k.endswith("." + key)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate(c: Config, baseline: Config | None = None, evaluating: bool = False) -> None:
    """Every value checked, in one place: finite numbers, ranges, names, cross-field rules, and no
    setting given (differing from ``baseline``, default: the defaults) where it cannot apply. What
    passes here trains (``evaluating``: evaluates); what fails is one clear message naming the key."""
    from podsrl.downsample import RULES
    from podsrl.rewards import load_reward
    from podsrl.tasks.gym import source_problem as gym_source_problem

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise PodsError(message)

    for key, value in _numbers(to_dict(c)):
        need(math.isfinite(value), f"{key} must be a finite number, got {value}")
    need(c.prompts_per_step >= 1, f"prompts_per_step must be >= 1, got {c.prompts_per_step}")
    need(c.n >= 2, f"n must be >= 2, got {c.n}: advantages compare a prompt's rollouts, and a group of one has none")
    need(c.n * c.prompts_per_step <= MAX_ROLLOUTS, f"n x prompts_per_step, the rollouts of a step, must be at most "
         f"{MAX_ROLLOUTS:,}, got {c.n} x {c.prompts_per_step}")
    need(c.steps >= 1, f"steps must be >= 1, got {c.steps}; podsrl eval evaluates a model without training")
    need(c.mode == "grpo" or 1 <= c.m <= c.n, f"m must be in 1..n, got m={c.m}, n={c.n}")
    need(c.m >= 2 or c.mode != "pods",
         f"mode=pods needs m >= 2, got m={c.m}: the m trained rollouts of a prompt are its group, and a group of one has advantage 0")
    need(c.rule in RULES, f"unknown rule {c.rule!r}; known: {', '.join(sorted(RULES))}")
    need(not c.adaptive_n or c.mode == "pods",
         f"adaptive_n needs mode=pods (it stops a prompt once its m trained rewards are settled); mode={c.mode} trains all n")
    need(not c.adaptive_n or c.rule == "max_variance",
         f"adaptive_n needs rule=max_variance (it stops a prompt once max-variance selection's m rewards are settled; "
         f"rule={c.rule} selects from all n); leave adaptive_n out, or use rule=max_variance")
    need(c.adaptive_round is None or 1 <= c.adaptive_round <= c.n,
         f"adaptive_round must be in 1..n, got {c.adaptive_round}")
    need(0 < c.prompt_filter_target < 1, f"prompt_filter_target must be in (0, 1), got {c.prompt_filter_target}")
    need(c.dynamic_sampling_rounds >= 1, f"dynamic_sampling_rounds must be >= 1, got {c.dynamic_sampling_rounds}")
    need(len(c.rewards) >= 1, "rewards must name at least one reward function")
    twice = [name for i, name in enumerate(c.rewards) if name in c.rewards[:i]]
    need(not twice, f"rewards names {twice[0]!r} twice; name it once, with the sum of its weights" if twice else "")
    need(len(c.rewards) == len(c.reward_weights), "rewards and reward_weights need the same length")
    need(c.reward_workers is None or c.reward_workers >= 0, "reward_workers must be >= 0")
    for name in c.rewards:
        fn = load_reward(name)  # a registered name, or an importable module:function
        unsent = c.reward_workers != 0 and _unpicklable(fn)
        need(not unsent, f"reward {name!r} cannot be sent to the reward workers ({unsent}): rewards must be "
                         "module-level functions, or reward_workers=0 scores in the training process")
        need(not c.adaptive_n or getattr(fn, "bounds", None) is not None,
             f"adaptive_n needs each reward's declared bounds to know when a prompt is settled; reward {name!r} "
             "declares none (set its bounds attribute to (lowest, highest))")
    need(c.reward_timeout_s > 0, "reward_timeout_s must be > 0")
    need(c.threads is None or c.threads >= 1, f"threads must be >= 1, got {c.threads}")
    need(c.async_lag >= 0, f"async_lag must be >= 0 (0: synchronous), got {c.async_lag}")
    need(c.async_worker_threads is None or c.async_worker_threads >= 1,
         f"async_worker_threads must be >= 1, got {c.async_worker_threads}")
    if c.async_lag:
        need(c.rollout.top_p == 1.0 or c.rollout.engine != "vllm",
             f"async_lag={c.async_lag} with rollout.engine=vllm and rollout.top_p={c.rollout.top_p}: the importance "
             "ratio of a truncated sampler needs the nucleus each token was drawn from (trl#6789), which vLLM returns "
             "only with return_sampling_mask (Model Runner V2 and a top-k bound), not wired here; use the HF engine "
             "or rollout.top_p=1.0")
        need(c.clock == "wall", f"async_lag={c.async_lag} with clock=cpu: the CPU clock counts the training process's "
             "CPU seconds, and the generation worker's would not count; use clock=wall")
        need(not c.save_rollouts, f"save_rollouts with async_lag={c.async_lag}: the generation worker samples, and "
             "its completions are not recorded; set save_rollouts=false (a replay then generates again)")
    need(c.reward_wall_timeout_s >= c.reward_timeout_s, "reward_wall_timeout_s must be >= reward_timeout_s")
    need(c.reward_memory_mb >= 0, f"reward_memory_mb must be >= 0 (0: no cap), got {c.reward_memory_mb}")
    need(c.reward_memory_mb == 0 or c.reward_workers != 0,
         "reward_memory_mb caps the reward workers; reward_workers=0 scores in the training process, without a cap")
    need(c.lr > 0, f"lr must be > 0, got {c.lr}")
    need(c.weight_decay >= 0, f"weight_decay must be >= 0, got {c.weight_decay}")
    need(c.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0: no clipping), got {c.max_grad_norm}")
    need(c.beta >= 0, f"beta must be >= 0, got {c.beta}")
    need(0 <= c.epsilon_low < 1 and c.epsilon_high >= 0,
         f"epsilon_low must be in [0, 1) and epsilon_high >= 0, got {c.epsilon_low} and {c.epsilon_high}")
    need(c.num_iterations >= 1, f"num_iterations must be >= 1, got {c.num_iterations}")
    need(not (c.loss_type == "vespo" and c.rollout.engine == "vllm" and c.vllm_importance_sampling_correction
              and c.vllm_importance_sampling_mode.startswith("sequence")),
         "loss_type=vespo folds vLLM's correction into its own sequence weight token by token: set "
         "vllm_importance_sampling_mode=token_truncate or token_mask")
    need(c.sapo_temperature_pos > 0 and c.sapo_temperature_neg > 0, "sapo_temperature_pos and _neg must be > 0")
    need(c.vespo_lambda_pos > 0 and c.vespo_lambda_neg > 0,
         f"vespo_lambda_pos and _neg must be > 0, got {c.vespo_lambda_pos} and {c.vespo_lambda_neg}")
    need(c.vllm_importance_sampling_cap >= 1,
         f"vllm_importance_sampling_cap must be >= 1, got {c.vllm_importance_sampling_cap}")
    need(c.micro_batch_size is None or c.micro_batch_size >= 1, "micro_batch_size must be >= 1")
    for key in ("eval_every", "eval_every_s", "eval_temperature", "save_every", "time_budget_s", "log_completions"):
        need(getattr(c, key) >= 0, f"{key} must be >= 0, got {getattr(c, key)}")
    r = c.rollout
    need(r.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {r.max_new_tokens}")
    need(r.temperature > 0, "rollout.temperature must be > 0 (RL needs sampled rollouts)")
    need(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}")
    need(r.batch_size is None or r.batch_size >= 1, f"rollout.batch_size must be >= 1, got {r.batch_size}")
    need(0 < r.gpu_memory_utilization <= 1, f"rollout.gpu_memory_utilization must be in (0, 1], got {r.gpu_memory_utilization}")
    need(r.kv_cache_mb is None or r.kv_cache_mb >= 1, f"rollout.kv_cache_mb must be >= 1, got {r.kv_cache_mb}")
    mo = c.model
    need(mo.lora_r >= 0, "model.lora_r must be >= 0")
    need(mo.lora_alpha > 0, f"model.lora_alpha must be > 0, got {mo.lora_alpha}")
    need(0 <= mo.lora_dropout < 1, f"model.lora_dropout must be in [0, 1), got {mo.lora_dropout}")
    need(not mo.load_in_4bit or mo.lora_r > 0 or evaluating, "model.load_in_4bit needs LoRA (model.lora_r > 0): 4-bit weights do not train")
    need(not (mo.load_in_4bit and r.engine == "vllm"),
         "model.load_in_4bit works with rollout.engine=hf; vLLM would need the unquantised weights")
    t = c.task
    need(t.name in ("arithmetic", "gym") or t.path is not None, f"task {t.name} needs task.path")
    need(t.name == "gym" or not (t.dataset or t.config or t.datasets),
         f"task.dataset, task.config and task.datasets are gym's (task.name=gym), not {t.name}'s")
    if t.name == "gym" and (problem := gym_source_problem(t.dataset, t.datasets)):
        raise PodsError(problem)
    need(t.name != "gym" or t.test_size >= 1, "task.name=gym needs task.test_size >= 1 (its problems are endless)")
    need(1 <= t.digits <= MAX_DIGITS, f"task.digits must be in 1..{MAX_DIGITS}, got {t.digits}")
    need(bool(t.operations) and not set(t.operations) - set("+-*"),
         f"task.operations must be drawn from '+-*', got {t.operations!r}")
    need(t.test_size >= 0, f"task.test_size must be >= 0 (0: all), got {t.test_size}")
    need(t.test_size >= 1 or t.name != "arithmetic",
         "task.test_size=0 means every problem of a test file; arithmetic generates its problems: give a number >= 1")
    _check_trackers(c.report_to)
    _check_applies(c, baseline or Config())


VLLM_ONLY = ("rollout.gpu_memory_utilization", "rollout.kv_cache_mb", "rollout.sleep", "rollout.dtype")
"""Settings of the vLLM engine: with the HF engine they would be recorded and do nothing."""
SAMPLER_CORRECTION = ("vllm_importance_sampling_correction", "vllm_importance_sampling_cap", "vllm_importance_sampling_mode")
"""Settings of the correction for a sampler that is not the trained policy (vLLM's kernels, or the
lagged policy of ``async_lag``): a synchronous HF engine samples from the policy itself, so with it
they would be recorded and do nothing."""
APPLIES_WITH = (  # (keys, what they need, the key that decides, whether this config has it)
    (VLLM_ONLY, "rollout.engine=vllm", "rollout.engine", lambda c: c.rollout.engine == "vllm"),
    (SAMPLER_CORRECTION, "rollout.engine=vllm or async_lag >= 1 (a sampler that is not the trained policy)", "rollout.engine",
     lambda c: c.rollout.engine == "vllm" or c.async_lag > 0),
    (("async_worker_threads",), "async_lag >= 1", "async_lag", lambda c: c.async_lag > 0),
    (("rollout.batch_size", "rollout.share_prompt_cache", "rollout.decoder"), "rollout.engine=hf",
     "rollout.engine", lambda c: c.rollout.engine == "hf"),
    (("model.lora_alpha", "model.lora_dropout", "model.lora_target_modules"), "LoRA (model.lora_r > 0)",
     "model.lora_r", lambda c: c.model.lora_r > 0),
    (("adaptive_round",), "adaptive_n=true", "adaptive_n", lambda c: c.adaptive_n),
    (("prompt_filter_target",), "prompt_filter=history", "prompt_filter", lambda c: c.prompt_filter == "history"),
    (("dynamic_sampling_rounds",), "dynamic_sampling=true", "dynamic_sampling", lambda c: c.dynamic_sampling),
    (("rule",), "mode=pods (the others train every rollout)", "mode", lambda c: c.mode == "pods"),
    (("epsilon_low",), "a clipped loss_type (grpo, bnpo, dr_grpo, dapo, luspo)", "loss_type",
     lambda c: c.loss_type not in ("cispo", "sapo", "vespo")),
    (("epsilon_high",), "a loss_type that clips or caps the ratio (not sapo or vespo)", "loss_type",
     lambda c: c.loss_type not in ("sapo", "vespo")),
    (("importance_sampling_level",), "a loss_type other than vespo, which weighs whole sequences itself (or with "
     "beta > 0 and use_bias_correction_kl, the KL's weight)", "loss_type",
     lambda c: c.loss_type != "vespo" or (c.beta > 0 and c.use_bias_correction_kl)),
    (("use_bias_correction_kl",), "beta > 0 (it weights the KL term)", "beta", lambda c: c.beta > 0),
    (("sapo_temperature_pos", "sapo_temperature_neg"), "loss_type=sapo", "loss_type", lambda c: c.loss_type == "sapo"),
    (("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), "loss_type=vespo", "loss_type",
     lambda c: c.loss_type == "vespo"),
    (("m",), "mode=pods or grpo-ga (grpo trains all n: leave m out, or give m=n)", "mode",
     lambda c: c.mode != "grpo" or c.m == c.n),
    (("task.path",), "task.name=gsm8k or math500", "task.name", lambda c: c.task.name in ("gsm8k", "math500")),
    (("task.train_path",), "task.name=math500", "task.name", lambda c: c.task.name == "math500"),
    (("task.digits", "task.operations"), "task.name=arithmetic", "task.name", lambda c: c.task.name == "arithmetic"),
)
"""Settings that apply only under another setting: given where they cannot apply, they are refused
rather than recorded and ignored."""


def _check_applies(c: Config, baseline: Config) -> None:
    """Refuse a setting that differs from ``baseline`` where it cannot apply (:data:`APPLIES_WITH`).
    A value equal to the baseline's counts as not given: ``podsrl compare`` checks each method's
    run against its shared config, whose ``m`` and ``rule`` are meant for the methods that use them."""
    values, base = flat_keys(to_dict(c)), flat_keys(to_dict(baseline))
    shown = lambda v: str(v).lower() if isinstance(v, bool) or v is None else str(v)
    for keys, needs, decider, applies in APPLIES_WITH:
        for key in keys:
            if values[key] != base[key] and not applies(c):
                raise PodsError(f"{key}={shown(values[key])} applies only with {needs}, not with "
                                f"{decider}={shown(values[decider])}")


EVAL_SETTINGS = ("model.name_or_path", "model.dtype", "model.trust_remote_code", "model.load_in_4bit", "task.",
                 "rollout.", "eval_temperature", "log_completions", "progress", "seed", "threads")
"""What ``podsrl eval`` reads of a config: the model to load, the task, the rollout engine."""


def check_eval_overrides(overrides: list[str]) -> None:
    """Refuse ``key=value`` overrides that ``podsrl eval`` would ignore (a config file may hold a
    training run's settings: eval reads only :data:`EVAL_SETTINGS` of it)."""
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key == "rollout.temperature":
            raise PodsError("podsrl eval generates at eval_temperature (0: greedy), not rollout.temperature")
        if not any(key == s or s.endswith(".") and (key.startswith(s) or s == f"{key}.") for s in EVAL_SETTINGS):
            raise PodsError(f"{key} is a training setting; podsrl eval takes model.name_or_path, model.dtype, "
                            "model.trust_remote_code, model.load_in_4bit, task.*, rollout.*, eval_temperature, "
                            "log_completions, progress, seed and threads")


def _unpicklable(fn) -> str:
    """Why ``fn`` cannot be pickled ("" where it can): a reward worker receives a function by its
    importable name, which a lambda or a nested function lacks."""
    import pickle

    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 (PicklingError, or whatever an object's state raises)
        return first_line(e)
    return ""


MAX_ROLLOUTS = 2**24
"""The most rollouts a step generates (n x prompts_per_step): far past any machine's memory, and
within the sizes that a tensor's index and Python's lists take."""
MAX_DIGITS = 1000
"""The most digits of an arithmetic operand: a product of two has 2,000, within Python's
4,300-digit limit on turning an integer into text."""


def _numbers(d: dict, prefix: str = ""):
    """(dotted key, value) of every float in a config dict, list items included."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _numbers(v, f"{prefix}{k}.")
        elif isinstance(v, float):
            yield f"{prefix}{k}", v
        elif isinstance(v, list):
            yield from ((f"{prefix}{k}[{i}]", x) for i, x in enumerate(v) if isinstance(x, float))


def _check_trackers(names: list[str]) -> None:
    """Tracker names accelerate knows, and installed."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    known = [t.value for t in LoggerType if t.value != "all"]
    available = {str(getattr(t, "value", t)) for t in get_available_trackers()}
    for name in names:
        if name not in known:
            raise PodsError(f"unknown tracker {name!r} in report_to; known: {', '.join(known)}")
        if name not in available:
            raise PodsError(f"report_to names {name!r}, which is not installed: pip install {name}")


NOT_RESULTS = frozenset({"output_dir", "resume", "replay", "save_rollouts", "allow_config_change", "progress", "report_to", "log_completions",
                         "save_every", "save_optimizer", "threads", "async_worker_threads"})
"""Settings that change where and how a run reports, not what it trains or measures."""
MAPPINGS = ("task.config.",)
"""Fields that hold a mapping of the user's keys: a key dropped from one is a change too."""
EXTENT = frozenset({"steps", "time_budget_s"})
"""Settings that say where a run ends (0 means unbounded), not what each step does."""


def config_changes(recorded: dict, c: Config, shorter: bool = True) -> list[str]:
    """The result-changing settings in which ``c`` differs from a run's recorded config (a dict of
    its ``config.yaml``), as ``key: old -> new`` lines. A key the record lacks was added to podsrl
    since: it counts as its default. ``steps`` and ``time_budget_s`` may grow; they may shrink
    too unless ``shorter`` is false (a finished run reused as it is would then say more than asked)."""
    new, old = flat_keys(to_dict(c)), flat_keys(to_dict(Config()))
    old.update(flat_keys(recorded))
    changes = []
    for key, value in new.items():
        before = old.get(key)
        if key.split(".")[0] in NOT_RESULTS or before == value:
            continue
        if key in EXTENT and (shorter or value == 0 or (before != 0 and before is not None and value > before)):
            continue
        changes.append(f"{key}: {before!r} -> {value!r}")
    for key, before in flat_keys(recorded).items():  # a setting the run had in a mapping, now dropped
        if key.startswith(MAPPINGS) and key not in new:
            changes.append(f"{key}: {before!r} -> unset")
    return changes


def flat_keys(d: dict, prefix: str = "") -> dict:
    """A nested dict as one level, keys dotted: ``{"model": {"lora_r": 8}}`` -> ``{"model.lora_r": 8}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def trained_per_prompt(c: Config) -> int:
    """Rollouts per prompt that reach the update."""
    return c.m if c.mode == "pods" else c.n


def to_dict(c: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(c))


def to_yaml(c: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(c))
