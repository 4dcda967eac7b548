"""Rollouts with vLLM, colocated with training on the same GPU (``pip install podsrl[vllm]``).

The engine holds its own copy of the policy's weights; :meth:`VLLMEngine.sync_weights` pushes the
current weights after every update (a LoRA adapter is merged into them first). With
``rollout.sleep`` vLLM releases its weights and KV cache while the update runs and wakes up for
the next rollout; ``rollout.gpu_memory_utilization`` caps what it takes when awake.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from podsrl.errors import PodsError
from podsrl.rollout import Rollouts
from podsrl.rollout.hf import eos_token_ids, mask_after_eos


class VLLMEngine:
    def __init__(self, model, tokenizer, config):
        if not torch.cuda.is_available():
            raise PodsError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on this machine")
        try:
            from vllm import LLM
        except ImportError:
            raise PodsError("rollout.engine=vllm needs vLLM: pip install 'podsrl[vllm]'") from None
        self.model, self.tokenizer, self.config = model, tokenizer, config
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        source = base.config._name_or_path or base.name_or_path
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.llm = LLM(
            model=source,
            dtype=str(base.dtype).removeprefix("torch."),
            gpu_memory_utilization=config.gpu_memory_utilization,
            enable_sleep_mode=config.sleep,
            # one engine per training process, each on its own GPU, inside the launcher's processes
            distributed_executor_backend="external_launcher" if world > 1 else None,
            seed=rank,
        )
        self.asleep = False
        self.stale = False  # weights pushed since the last update
        if config.sleep:
            self._sleep()

    # ------------------------------------------------------------------ weights

    def _named_weights(self):
        """The policy's current weights under the names of the base model (LoRA merged)."""
        peft = hasattr(self.model, "merge_adapter")
        if peft:
            self.model.merge_adapter()
        try:
            for name, tensor in self.model.state_dict().items():
                if peft:
                    if "lora_" in name:  # merged into the base weights above
                        continue
                    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                yield name, tensor
        finally:
            if peft:
                self.model.unmerge_adapter()

    def _vllm_model(self):
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        runner = getattr(worker, "model_runner", None) or getattr(worker, "worker").model_runner
        return runner.model

    def sync_weights(self) -> None:
        """Push the policy's weights into vLLM (called after every optimizer step)."""
        self.stale = True

    def _push(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        target = self._vllm_model()
        with torch.no_grad():
            for name, tensor in self._named_weights():
                target.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()
        self.stale = False

    def _sleep(self) -> None:
        torch.cuda.empty_cache()
        self.llm.sleep(level=2)  # drop weights and KV cache: the next generate re-pushes weights
        self.asleep, self.stale = True, True

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
                 seeds: list[int] | None = None, on_chunk=None) -> Rollouts:
        from vllm import SamplingParams

        if self.stale:
            self._push()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        params = [
            SamplingParams(n=n, temperature=temperature, top_p=self.config.top_p if temperature > 0 else 1.0,
                           max_tokens=max_new_tokens, seed=None if seeds is None else seeds[i])
            for i in range(len(prompts))
        ]
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        token_prompts = [{"prompt_token_ids": ids[m.bool()].tolist()} for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        outputs = self.llm.generate(token_prompts, sampling_params=params, use_tqdm=False)
        completions = [torch.tensor(o.token_ids, dtype=torch.long) for out in outputs for o in out.outputs]
        if self.config.sleep:
            self._sleep()

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        width = max(1, max(len(c) for c in completions))
        ids = torch.stack([F.pad(c, (0, width - len(c)), value=pad) for c in completions]).to(device)
        lengths = torch.tensor([len(c) for c in completions], device=device)
        ids, mask = mask_after_eos(ids, eos_token_ids(self.model, self.tokenizer), pad)
        mask = mask * (torch.arange(width, device=device) < lengths.unsqueeze(1))
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        if on_chunk is not None:  # vLLM returns every group at once
            on_chunk(0, texts, [row[m.bool()].tolist() for row, m in zip(ids, mask)])
        return Rollouts(
            enc["input_ids"].repeat_interleave(n, 0).to(device), enc["attention_mask"].repeat_interleave(n, 0).to(device),
            ids, mask.long(), texts,
        )
