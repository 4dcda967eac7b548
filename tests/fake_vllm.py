"""A stand-in for vLLM's ``LLM`` that records every call the engine makes, for tests of the order
of pushes, wake-ups and generations without vLLM (and without a GPU).

Its samples depend on the request's seed alone (not on the weights), so runs under any number of
processes sample the same tokens; each sampled token comes with a log-prob, as vLLM returns with
``SamplingParams(logprobs=0)``. Built as vLLM's ``LLM`` is (``FakeLLM.engine``), it keeps the
engine arguments it was given (``engine_args``). ``torch.cuda.empty_cache`` is recorded too while :func:`install`
is in effect (the engine calls it on the CUDA path).
"""

from __future__ import annotations

import hashlib
import sys
from types import SimpleNamespace

import torch

MAX_MODEL_LEN = 256


class SamplingParams:
    """vLLM's ``SamplingParams``, as the fields it is given."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
        self.logprobs = kwargs.get("logprobs")


class FakeLLM:
    def __init__(self, log: list, vocab: int, logprob_shift: float = 0.0, **engine_args):
        self.log, self.vocab, self.logprob_shift = log, vocab, logprob_shift
        self.engine_args = engine_args  # what vLLM's LLM(...) would have been given
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN))
        self.pushed: list[str] = []  # a digest of each push's weights
        self.sums: list[float] = []  # and the sum of their absolute values

    def collective_rpc(self, method: str, kwargs: dict):
        assert method == "reload_weights"
        digest, total = hashlib.sha256(), 0.0
        for name, tensor in kwargs["weights_iterator"]:  # every tensor, gathered where sharded
            digest.update(name.encode())
            digest.update(tensor.detach().float().contiguous().numpy().tobytes())
            total += float(tensor.detach().double().abs().sum())
        self.pushed.append(digest.hexdigest()[:16])
        self.sums.append(total)
        self.log.append("push")

    def reset_prefix_cache(self):
        self.log.append("reset_prefix_cache")

    def sleep(self, level: int):
        self.log.append(f"sleep:{level}")

    def wake_up(self, tags: list[str]):
        self.log.append("wake_up:" + ",".join(tags))

    def generate(self, prompts: list[dict], sampling_params: list[SamplingParams], use_tqdm: bool = False):
        self.log.append("generate")
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            samples = []
            for j in range(params.n):
                g = torch.Generator().manual_seed(params.seed + j)
                length = int(torch.randint(1, params.max_tokens + 1, (1,), generator=g))
                tokens = torch.randint(0, self.vocab, (length,), generator=g).tolist()
                logprobs = None
                if params.logprobs is not None:
                    values = -torch.rand(length, generator=g).double() * 5 + self.logprob_shift
                    logprobs = [{t: SimpleNamespace(logprob=float(v))} for t, v in zip(tokens, values)]
                samples.append(SimpleNamespace(token_ids=tokens, logprobs=logprobs))
            outputs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=samples))
        return outputs


def as_vllm_module(monkeypatch, built: list) -> None:
    """Stand in for the ``vllm`` module: its ``LLM(**engine_args)`` builds a :class:`FakeLLM`
    (added to ``built``), so that the engine's own start-up path runs."""
    def llm(**engine_args):
        built.append(FakeLLM([], 16, **engine_args))
        return built[-1]

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=llm, SamplingParams=SamplingParams))


def install(monkeypatch, trainer, log: list, **fake) -> list:
    """Have ``trainer`` build its engine as a :class:`podsrl.rollout.vllm.VLLMEngine` around a
    :class:`FakeLLM` recording into ``log`` (whatever ``rollout.engine`` says), with vLLM's module
    stood in for; returns the list the fakes built are added to."""
    from podsrl.rollout.vllm import VLLMEngine

    built = []
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=SamplingParams))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    monkeypatch.setattr(trainer, "check_engine", lambda name, config, autocast=False: None)

    def make_engine(name, model, tokenizer, config, trust_remote_code=False, autocast=False):
        llm = FakeLLM(log, len(tokenizer), **fake)
        built.append(llm)
        return VLLMEngine(model, tokenizer, config, trust_remote_code, llm=llm)

    monkeypatch.setattr(trainer, "make_engine", make_engine)
    return built
