"""Rollout throughput of the HF engine's settings, and vLLM where a GPU and vLLM are present, on
the same prompts and the same device, side by side; ratios against the first row, the engine's
former default (transformers' generate with the shared prompt prefill, 128 rows per call).

    python benchmarks/rollout.py [--prompts 4] [--n 32] [--tokens 12] [model.name_or_path=...]

A model that stops early (a trained checkpoint) shows what dropping finished rows saves; the
untrained model mostly runs to the token limit.

``--crossover 128,256,512,1024`` measures instead the loop and the static decoder at each of those
rows per generate call (``rows / n`` prompts of ``n`` rollouts, one call each): the crossover below
which ``rollout.decoder=auto`` takes the static decoder on a CUDA GPU. Generation runs under the
autocast a training run would use (``--mixed-precision``; default bf16 on a CUDA GPU, none on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

from podsrl import models
from podsrl.config import load_config
from podsrl.evaluate import chat_prompt
from podsrl.rollout.hf import STATIC_MAX_ROWS, HFEngine
from podsrl.tasks import load_task


def timed(engine, prompts, n, tokens, repeats=2, autocast=contextlib.nullcontext, warm_up=True):
    """Best seconds of ``repeats`` calls, and the completion tokens of the last one; after a tiny
    warm-up call, or none (``warm_up=False``)."""
    with autocast():
        if warm_up:
            engine.generate(prompts[:1], 2, 0.9, 2, seeds=[0])
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


def engines_table(args, model, tokenizer, prompts, c, device, autocast) -> None:
    results = {}
    engines = {
        "generate, shared, 128/call": HFEngine(model, tokenizer, batch_size=128, decoder="generate"),
        "loop, shared": HFEngine(model, tokenizer, decoder="loop"),
        "generate, per rollout": HFEngine(model, tokenizer, share_prompt_cache=False, decoder="generate"),
        "loop, per rollout": HFEngine(model, tokenizer, share_prompt_cache=False, decoder="loop"),
        "static cache (compiled on GPU)": HFEngine(model, tokenizer, decoder="static"),
        "auto (default)": HFEngine(model, tokenizer),
    }
    runs = {name: [] for name in engines}
    for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine hits every engine
        for name, engine in engines.items():
            runs[name].append(timed(engine, prompts, args.n, args.tokens, repeats=1, autocast=autocast))
    for name, measured in runs.items():
        results[name] = min(measured)
    if device == "cuda":
        try:
            from podsrl.rollout.vllm import VLLMEngine

            c.rollout.gpu_memory_utilization = 0.5
            results["vllm"] = timed(VLLMEngine(model, tokenizer, c.rollout), prompts, args.n, args.tokens)
        except Exception as e:  # noqa: BLE001 (report and keep the HF figures)
            print(f"vllm: not measured ({type(e).__name__}: {e})")
    base = next(iter(results.values()))
    base_rate = base[1] / base[0]
    for name, (seconds, tokens) in results.items():
        print(f"{name:<30} {seconds:7.2f} s  {tokens:6d} tokens  {tokens / seconds:8.0f} tokens/s  {tokens / seconds / base_rate:5.2f}x")


def crossover(rows_list: list[int], rates: dict[int, dict[str, float]]) -> tuple[int | None, int | None]:
    """(the most rows per call up to which static was at least as fast as loop at every measured
    size, the fewest rows at which it was slower); None where there is no such size."""
    faster_up_to, slower_from = None, None
    for rows in sorted(rows_list):
        if rates[rows]["static"] >= rates[rows]["loop"] and slower_from is None:
            faster_up_to = rows
        elif slower_from is None:
            slower_from = rows
    return faster_up_to, slower_from


def crossover_table(args, model, tokenizer, all_prompts, device, autocast) -> dict:
    rows_list = [int(r) for r in args.crossover.split(",")]
    bad = [r for r in rows_list if r < args.n or r % args.n]
    if bad:
        raise SystemExit(f"rollout.py: error: --crossover sizes must be multiples of --n={args.n}, got {bad}")
    rates = {}
    print("rows per call   loop tok/s  static tok/s  static/loop")
    for rows in rows_list:
        prompts = all_prompts[: rows // args.n]  # one generate call of exactly `rows` rows
        measured = {d: [] for d in ("loop", "static")}
        engines = {d: HFEngine(model, tokenizer, batch_size=rows, decoder=d) for d in measured}
        for d, engine in engines.items():  # a first call of this shape compiles static's graphs for it
            timed(engine, prompts, args.n, args.tokens, repeats=1, autocast=autocast, warm_up=False)
        for _ in range(args.repeats):  # interleaved
            for d, engine in engines.items():
                measured[d].append(timed(engine, prompts, args.n, args.tokens, repeats=1, autocast=autocast, warm_up=False))
        rates[rows] = {d: max(tokens / seconds for seconds, tokens in m) for d, m in measured.items()}
        r = rates[rows]
        print(f"{rows:>13} {r['loop']:>12.0f} {r['static']:>13.0f} {r['static'] / r['loop']:>12.2f}", flush=True)
    faster_up_to, slower_from = crossover(rows_list, rates)
    faster = f"static at least as fast as loop up to {faster_up_to} rows per call" if faster_up_to else "static slower at every size"
    slower = f"slower from {slower_from}" if slower_from else "slower at none measured"
    print(f"{faster}; {slower} (rollout.decoder=auto takes static on a CUDA GPU up to {STATIC_MAX_ROWS} rows per call)")
    return {"device": device, "n": args.n, "tokens": args.tokens, "mixed_precision": args.mixed_precision,
            "rates_tokens_per_s": rates, "static_faster_up_to_rows": faster_up_to, "static_slower_from_rows": slower_from,
            "auto_static_max_rows": STATIC_MAX_ROWS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="timings per engine (the best is kept)")
    parser.add_argument("--crossover", help="rows per call, comma separated: loop against static at each")
    parser.add_argument("--mixed-precision", choices=["no", "bf16"],
                        help="autocast during generation (default: bf16 on a CUDA GPU, as training, else no)")
    parser.add_argument("--json", help="--crossover: also write the results here")
    args, overrides = parser.parse_known_args()
    c = load_config(None, overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.mixed_precision = args.mixed_precision or ("bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "no")
    autocast = ((lambda: torch.autocast(device, dtype=torch.bfloat16)) if args.mixed_precision == "bf16"
                else contextlib.nullcontext)
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype).to(device)
    task = load_task(c.task.name, path=c.task.path, digits=c.task.digits, operations=c.task.operations)
    wanted = max(int(r) for r in args.crossover.split(",")) // args.n if args.crossover else args.prompts
    prompts = [chat_prompt(tokenizer, task.system_prompt, p.question) for _, p in zip(range(max(wanted, 1)), task.train(0))]
    if args.crossover:
        print(f"loop vs static decoder by rows per generate call: {args.n} rollouts per prompt, up to {args.tokens} "
              f"new tokens, on {device}, mixed precision {args.mixed_precision}; best of {args.repeats} interleaved rounds")
        result = crossover_table(args, model, tokenizer, prompts, device, autocast)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return
    print(f"{args.prompts} prompts x {args.n} rollouts, up to {args.tokens} new tokens, on {device}, "
          f"mixed precision {args.mixed_precision}")
    engines_table(args, model, tokenizer, prompts, c, device, autocast)


if __name__ == "__main__":
    main()
