"""Peak memory of one update phase: GRPO with all n rollouts at once, GRPO-GA (all n, micro-
batches of m per prompt) and PODS (m of n), at the same n, on the embedded model.

Each variant runs in a fresh process on the same seeded rollouts and reports the first update's
peak memory (resident set on a CPU, the CUDA allocator's peak on a GPU) above the level before it:
activations, gradients and the optimizer state created by that first step. Gradients and
optimizer state are the same for every variant; with LoRA (``model.lora_r=16``) they are small
and the activations, which grow with the sequences trained at once, dominate.

    python benchmarks/memory.py [--n 32] [--m 8] [--prompts 4] [model.name_or_path=...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

VARIANTS = {  # name -> overrides
    "grpo (all n at once)": ["mode=grpo", "m={n}"],  # GRPO trains all n: m = n
    "grpo-ga (n, micro-batches of m)": ["mode=grpo-ga"],
    "pods (m of n)": ["mode=pods"],
}


def measure(overrides: list[str]) -> dict:
    """One update on seeded rollouts, in this process; returns its memory and time."""
    import tempfile
    import time

    import torch

    from podsrl.config import load_config
    from podsrl.evaluate import chat_prompt
    from podsrl.memory import PeakMemory
    from podsrl.trainer import down_sample, setup, update

    c = load_config(None, [*overrides, f"output_dir={tempfile.mkdtemp()}/run"])
    s = setup(c)
    problems = [p for _, p in zip(range(c.prompts_per_step), s.task.train(c.seed))]
    prompts = [chat_prompt(s.tokenizer, s.system_prompt, p.question) for p in problems]
    rollouts = s.engine.generate(prompts, c.n, c.rollout.temperature, c.rollout.max_new_tokens, seeds=list(range(len(prompts))))
    rewards = torch.randint(0, 2, (len(prompts), c.n), generator=torch.Generator().manual_seed(0)).float()
    chosen = down_sample(c, rewards, step=1)
    start = time.perf_counter()
    with PeakMemory(s.accelerator.device) as mem:
        stats = update(s, c, rollouts, chosen, step=1)
    return {"peak_mb": mem.peak_mb, "delta_mb": mem.delta_mb, "seconds": time.perf_counter() - start,
            "trained_sequences": stats["trained_sequences"], "micro_batches": stats["micro_batches"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--m", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    common = [f"n={args.n}", f"m={args.m}", f"prompts_per_step={args.prompts}", "progress=false", *overrides]
    from podsrl.config import load_config
    from podsrl.errors import PodsError

    try:
        checkpointing = "on" if load_config(None, common).model.gradient_checkpointing else "off"
    except PodsError as e:
        sys.exit(f"memory.py: error: {e}")
    print(f"one update phase, n={args.n}, m={args.m}, {args.prompts} prompts, gradient checkpointing {checkpointing}; "
          "each in a fresh process")
    print(f"{'variant':<34} {'trained':>8} {'micro':>6} {'update MB':>10} {'peak RSS MB':>12} {'seconds':>8}")
    results = {}
    for name, extra in VARIANTS.items():
        given = common + [o.format(n=args.n) for o in extra]  # the variant's m last: it wins
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(given)], capture_output=True, text=True)
        if out.returncode != 0:  # out of memory, bad overrides, ...: say why, and go on
            lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
            why = lines[-1] if lines else f"exit code {out.returncode}" + (" (killed: out of memory?)" if out.returncode < 0 else "")
            print(f"{name:<34} failed: {why}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[name] = r
        print(f"{name:<34} {r['trained_sequences']:>8} {r['micro_batches']:>6} {r['delta_mb']:>10.0f} {r['peak_mb']:>12.0f} {r['seconds']:>8.1f}")
    pods = results.get("pods (m of n)", {}).get("delta_mb")
    ratios = [f"{k.split()[0]} / pods: {results[k]['delta_mb'] / pods:.2f}x" for k in list(VARIANTS)[:2] if k in results and pods]
    if ratios:
        print("\nupdate memory ratio " + ";  ".join(ratios))
    if len(results) < len(VARIANTS):
        sys.exit(1)


if __name__ == "__main__":
    main()
