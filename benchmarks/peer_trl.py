"""podsrl's GRPO against TRL's GRPOTrainer on the same model, prompts, rollouts and token budget.

Both train the embedded model (SmolLM2-135M-Instruct) with vanilla GRPO (every rollout trained,
no KL, one update per generation) on the same arithmetic prompts: ``--prompts`` per step,
``--n`` rollouts each, up to ``--tokens`` new tokens, podsrl's accuracy reward, lr 3e-5,
temperature 0.9. Each run is a fresh process; they run one after the other. Printed per run:

  * step s: median wall time of an optimizer step (generation, scoring, update), steps 2.. only;
  * rollout tok/s: completion tokens generated per second of generation;
  * update peak MB: the peak during the update phase (loss, backward, optimizer step): the CUDA
    allocator's peak on a GPU, the process's peak resident set on a CPU; and its rise above the
    level before the update ("delta").

Two comparisons: each side with its own defaults (TRL: bf16 autocast and gradient checkpointing;
podsrl: gradient checkpointing, bf16 autocast on a CUDA GPU and fp32 on a CPU, and on a GPU the
static decoder for calls of up to 512 rows), then both in fp32 without checkpointing. A fifth run,
podsrl's defaults with the loop decoder, shows what the decoder choice gives.

    python benchmarks/peer_trl.py [--prompts 4] [--n 16] [--tokens 16] [--steps 6] [--runs trl-defaults,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = {  # name -> (side, settings); --runs names them side-settings
    "TRL, its defaults": ("trl", "defaults"),
    "podsrl, its defaults": ("podsrl", "defaults"),
    "TRL, fp32": ("trl", "fp32"),
    "podsrl, fp32": ("podsrl", "fp32"),
    "podsrl, loop decoder": ("podsrl", "loop"),  # its defaults with rollout.decoder=loop
}


def problems(args):
    from podsrl.tasks import arithmetic

    task = arithmetic(digits=args.digits, operations="+-*", test_size=1)
    stream = task.train(0)
    return task, [next(stream) for _ in range(args.prompts * args.steps)]


def run_podsrl(args, settings: str) -> dict:
    from podsrl.config import load_config
    from podsrl.trainer import train

    out = tempfile.mkdtemp() + "/run"
    c = load_config(None, [
        "mode=grpo", f"n={args.n}", f"m={args.n}", f"prompts_per_step={args.prompts}", f"steps={args.steps}",
        f"rollout.max_new_tokens={args.tokens}", "rollout.temperature=0.9", "lr=3e-5", "task.operations=+-*",
        f"task.digits={args.digits}", "task.test_size=1", "progress=false", f"output_dir={out}", "save_every=0",
        f"model.name_or_path={args.model}",
        *(["model.gradient_checkpointing=false", "mixed_precision=no"] if settings == "fp32" else []),
        *(["rollout.decoder=loop"] if settings == "loop" else []),
    ])
    train(c)
    rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if "update_s" in l]
    return {
        "step_s": [r["generation_s"] + r["scoring_s"] + r["selection_s"] + r["update_s"] for r in rows],
        "generation_s": [r["generation_s"] for r in rows],
        "tokens": [r["generated_completion_length"] * args.prompts * args.n for r in rows],
        "update_peak_mb": [r["update_peak_memory_mb"] for r in rows],
        "update_delta_mb": [r["update_memory_delta_mb"] for r in rows],
    }


def run_trl(args, settings: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from podsrl.memory import PeakMemory
    from podsrl.models import _local_source
    from podsrl.rewards import accuracy_reward

    task, items = problems(args)
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": task.system_prompt},
                                          {"role": "user", "content": p.question}], "answer": p.answer} for p in items])
    record = {"step_s": [], "generation_s": [], "tokens": [], "update_peak_mb": [], "update_delta_mb": []}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class Timed(GRPOTrainer):
        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            record["generation_s"].append(time.perf_counter() - start)
            record["tokens"].append(sum(len(c) for c in out[1]))  # completion ids per rollout
            return out

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.update_memory = PeakMemory(device).__enter__()  # the update starts here
            return out

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            record["step_s"].append(time.perf_counter() - self.start)
            trainer.update_memory.__exit__(None, None, None)
            record["update_peak_mb"].append(trainer.update_memory.peak_mb)
            record["update_delta_mb"].append(trainer.update_memory.delta_mb)

    fp32 = dict(bf16=False, gradient_checkpointing=False, model_init_kwargs={"dtype": torch.float32}) if settings == "fp32" else {}
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.prompts * args.n, num_generations=args.n,
        max_completion_length=args.tokens, max_steps=args.steps, learning_rate=3e-5, temperature=0.9, beta=0.0,
        report_to="none", logging_steps=1, save_strategy="no", use_cpu=device.type == "cpu", seed=0,
        shuffle_dataset=False, **fp32,
    )
    trainer = Timed(model=_local_source(args.model), args=config, reward_funcs=[accuracy_reward],
                    train_dataset=data, callbacks=[Clock()])
    trainer.train()
    return record


def summary(r: dict) -> dict:
    later = slice(1, None)  # the first step builds the optimizer state and warms up
    return {
        "step_s": statistics.median(r["step_s"][later]),
        "tokens_per_s": sum(r["tokens"][later]) / sum(r["generation_s"][later]),
        "update_peak_mb": max(r["update_peak_mb"][later]),
        "update_delta_mb": max(r["update_delta_mb"][later]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--model", default="smollm2", help="both sides' model (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--runs", help="comma-separated side-settings of the runs to make (default: all): "
                        + ", ".join(f"{side}-{settings}" for side, settings in RUNS.values()))
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.only:
        side, settings = RUNS[args.only]
        result = (run_trl if side == "trl" else run_podsrl)(args, settings)
        print("RESULT " + json.dumps(result))
        return

    from importlib.metadata import PackageNotFoundError, version

    import torch

    runs = [name for name, (side, settings) in RUNS.items() if args.runs is None or f"{side}-{settings}" in args.runs.split(",")]
    unknown = set(args.runs.split(",")) - {f"{side}-{settings}" for side, settings in RUNS.values()} if args.runs else set()
    if unknown or not runs:
        parser.error(f"unknown --runs {', '.join(sorted(unknown)) or args.runs}")
    try:
        trl_version = version("trl")
    except PackageNotFoundError:
        trl_version = "not installed"
    model = "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"GRPO step on {model}: {args.prompts} prompts x {args.n} rollouts, up to {args.tokens} new tokens; "
          f"{args.steps} steps (first excluded); {device}; TRL {trl_version}, torch {torch.__version__}")
    print(f"{'run':<22} {'step s':>8} {'rollout tok/s':>14} {'update peak MB':>15} {'delta MB':>9}")
    results = {}
    for name in runs:
        child = [sys.executable, __file__, "--only", name] + [f"--{k}={v}" for k, v in vars(args).items()
                                                              if k in ("prompts", "n", "tokens", "steps", "digits", "model")]
        out = subprocess.run(child, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
            print(f"{name:<22} failed: {why}")
            continue
        results[name] = r = summary(json.loads(lines[-1][len("RESULT "):]))
        print(f"{name:<22} {r['step_s']:>8.2f} {r['tokens_per_s']:>14.0f} {r['update_peak_mb']:>15.0f} {r['update_delta_mb']:>9.0f}",
              flush=True)
    print()
    for ours_name, trl_name in [("podsrl, its defaults", "TRL, its defaults"), ("podsrl, fp32", "TRL, fp32"),
                                ("podsrl, loop decoder", "TRL, its defaults")]:
        trl_run, ours = results.get(trl_name), results.get(ours_name)
        if trl_run and ours:
            print(f"{ours_name} / {trl_name}: step time {ours['step_s'] / trl_run['step_s']:.2f}x (target <= 0.75), "
                  f"rollout tok/s {ours['tokens_per_s'] / trl_run['tokens_per_s']:.2f}x, "
                  f"update peak {ours['update_peak_mb'] / trl_run['update_peak_mb']:.2f}x (target <= 1)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if len(results) < len(runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
