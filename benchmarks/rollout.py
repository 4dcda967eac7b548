"""Rollout throughput of the HF engine's settings, and of the vLLM engine wherever vLLM is
installed (its CPU build included), on the same prompts and the same device, side by side; ratios
against the first row, the engine's former default (transformers' generate with the shared prompt
prefill, 128 rows per call).

    python benchmarks/rollout.py [--prompts 4] [--n 32] [--tokens 12] [model.name_or_path=...]
    .venv-vllm/bin/python benchmarks/rollout.py [model.dtype=bfloat16]     # with the vLLM row, on a CPU

A model that stops early (a trained checkpoint) shows what dropping finished rows saves; the
untrained model mostly runs to the token limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch

from podsrl import models
from podsrl.config import load_config
from podsrl.evaluate import chat_prompt
from podsrl.rollout.hf import HFEngine
from podsrl.tasks import load_task


def timed(engine, prompts, n, tokens, repeats=2):
    engine.generate(prompts[:1], 2, 0.9, 2, seeds=[0])  # warm-up
    best = float("inf")
    for r in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = engine.generate(prompts, n, 0.9, tokens, seeds=list(range(r * 100, r * 100 + len(prompts))))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, int(out.completion_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="timings per engine (the best is kept)")
    args, overrides = parser.parse_known_args()
    c = load_config(None, overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype).to(device)
    task = load_task(c.task.name, path=c.task.path, digits=c.task.digits, operations=c.task.operations)
    prompts = [chat_prompt(tokenizer, task.system_prompt, p.question) for _, p in zip(range(args.prompts), task.train(0))]
    print(f"{args.prompts} prompts x {args.n} rollouts, up to {args.tokens} new tokens, on {device}")
    results = {}
    engines = {
        "generate, shared, 128/call": HFEngine(model, tokenizer, batch_size=128, decoder="generate"),
        "loop, shared (default)": HFEngine(model, tokenizer),
        "generate, per rollout": HFEngine(model, tokenizer, share_prompt_cache=False, decoder="generate"),
        "loop, per rollout": HFEngine(model, tokenizer, share_prompt_cache=False),
        "static cache (compiled on GPU)": HFEngine(model, tokenizer, decoder="static"),
    }
    if importlib.util.find_spec("vllm") is None:
        print("vllm: not measured (not installed here; the vLLM virtualenv has it: make install-vllm)")
    else:
        try:
            from podsrl.rollout.vllm import VLLMEngine

            if device == "cuda":
                c.rollout.gpu_memory_utilization = 0.5
            elif c.rollout.kv_cache_mb is None:  # every rollout of the call in flight at once
                c.rollout.kv_cache_mb = 1024
            engines["vllm"] = VLLMEngine(model, tokenizer, c.rollout)
        except Exception as e:  # noqa: BLE001 (report and keep the HF figures)
            print(f"vllm: not measured ({type(e).__name__}: {e})")
    runs = {name: [] for name in engines}
    for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine hits every engine
        for name, engine in engines.items():
            runs[name].append(timed(engine, prompts, args.n, args.tokens, repeats=1))
    for name, measured in runs.items():
        results[name] = min(measured)
    base = next(iter(results.values()))
    base_rate = base[1] / base[0]
    for name, (seconds, tokens) in results.items():
        print(f"{name:<28} {seconds:7.2f} s  {tokens:6d} tokens  {tokens / seconds:8.0f} tokens/s  {tokens / seconds / base_rate:5.2f}x")


if __name__ == "__main__":
    main()
