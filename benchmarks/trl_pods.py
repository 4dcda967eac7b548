"""TRL's GRPOTrainer against podsrl's PODSTrainer on the arithmetic task, one after the other.

GRPO trains all ``n`` completions of every prompt; PODS generates the same ``n`` and trains the
max-variance ``m``. Each method runs in a fresh process for the same training time (checked after
every optimizer step, so a run may overshoot by up to one step), then is evaluated greedily on the
task's held-out problems. Reported per method: optimizer steps, seconds per step (generation and
scoring / update), the update's peak memory (the process's peak resident set on a CPU, the CUDA
allocator's peak on a GPU, from the end of generation to the end of the optimizer step) and its
rise above the level at the start of the update, and held-out accuracy.

With ``--beta`` > 0 (a KL penalty to the reference model) TRL computes the reference model's
per-token log-probabilities of the generation batch, without gradients; GRPOTrainer does it for
all n completions per prompt, PODSTrainer for the m it keeps. The table reports the seconds those
no-grad forwards take per step and the completions they run on: the saving.

    python benchmarks/trl_pods.py [--budget-s 600] [--prompts 4] [--n 32] [--m 8] [--eval-problems 200] \
        [--beta 0.04] [--out benchmarks/results/trl_pods]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

METHODS = ("grpo", "pods")


def accuracy(completions, answer, **_):
    """podsrl's accuracy reward; TRL passes chat completions as message lists."""
    from podsrl.rewards import accuracy_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return accuracy_reward(texts, answer)


def run(method: str, a: argparse.Namespace) -> dict:
    """Train one method for the budget in this process, evaluate it, return its figures."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from podsrl import models
    from podsrl.evaluate import evaluate
    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    from podsrl.memory import PeakMemory
    from podsrl.rollout.hf import HFEngine
    from podsrl.tasks import arithmetic

    task = arithmetic(digits=a.digits, operations=a.operations, test_size=a.eval_problems, seed=a.seed)
    stream = task.train(a.seed)
    problems = [next(stream) for _ in range(a.train_problems)]
    system = [{"role": "system", "content": task.system_prompt}]
    dataset = Dataset.from_list([{"prompt": system + [{"role": "user", "content": p.question}], "answer": p.answer}
                                 for p in problems])
    tokenizer = models.load_tokenizer(a.model)
    model = models.load_model(a.model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    engine = HFEngine(model, tokenizer)
    figures = {"method": method}
    if a.eval_base:
        model.to(device)
        figures["base_accuracy"] = evaluate(engine, tokenizer, task.test, task.system_prompt,
                                            a.max_new_tokens).accuracy

    common = dict(
        output_dir=os.path.join(a.workdir, method), report_to="none", bf16=False, use_cpu=device.type == "cpu",
        num_generations=a.n, per_device_train_batch_size=a.prompts * a.n, gradient_accumulation_steps=1,
        max_completion_length=a.max_new_tokens, temperature=a.temperature, learning_rate=a.lr,
        loss_type=a.loss_type, gradient_checkpointing=a.gradient_checkpointing, max_steps=10**6, logging_steps=1,
        save_strategy="no", seed=a.seed, disable_tqdm=True, beta=a.beta,
    )
    if method == "pods":
        args, trainer_class = PODSConfig(**common, pods_m=a.m), PODSTrainer
    else:
        args, trainer_class = GRPOConfig(**common), GRPOTrainer
    trainer = trainer_class(model=model, reward_funcs=accuracy, args=args, train_dataset=dataset,
                            processing_class=tokenizer)

    steps = []  # per optimizer step: seconds of generation+scoring (+selection), of the update, memory
    generate = trainer._generate_and_score_completions

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_begin(self, *_, **__):
            self.step_start, self.memory, self.no_grad_s, self.no_grad_rows = time.perf_counter(), None, 0.0, 0

        def on_step_end(self, args, state, control, **_):
            now = time.perf_counter()
            self.memory.__exit__(None, None, None)
            steps.append({"generation_s": self.generated - self.step_start, "update_s": now - self.generated,
                          "peak_mb": self.memory.peak_mb, "rise_mb": self.memory.delta_mb,
                          "no_grad_logps_s": self.no_grad_s, "no_grad_logps_rows": self.no_grad_rows})
            control.should_training_stop = now - self.start >= a.budget_s

    clock = Clock()
    logps = trainer._get_per_token_logps_and_entropies

    def timed_logps(model, input_ids, *args, **kwargs):
        """The old-policy and reference log-probabilities, computed without gradients: timed."""
        if torch.is_grad_enabled():  # the loss's forward
            return logps(model, input_ids, *args, **kwargs)
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        synchronize()
        start = time.perf_counter()
        out = logps(model, input_ids, *args, **kwargs)
        synchronize()
        if out[0] is not None:  # PODSTrainer returns nothing while TRL builds the batch: it runs them later
            clock.no_grad_s += time.perf_counter() - start
            clock.no_grad_rows += input_ids.shape[0]
        return out

    trainer._get_per_token_logps_and_entropies = timed_logps

    def timed_generate(inputs):
        out = generate(inputs)
        clock.generated = time.perf_counter()
        clock.memory = PeakMemory(device).__enter__()  # the update starts here
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.add_callback(clock)
    trainer.train()
    figures["train_s"] = time.perf_counter() - clock.start
    figures["steps"] = steps
    trained = trainer.accelerator.unwrap_model(trainer.model)
    figures["accuracy"] = evaluate(HFEngine(trained, tokenizer), tokenizer, task.test, task.system_prompt,
                                   a.max_new_tokens).accuracy
    figures["rewards"] = [row.get("reward") for row in trainer.state.log_history if "reward" in row]
    figures["selected_rewards"] = [row["pods/selected_reward"] for row in trainer.state.log_history
                                   if "pods/selected_reward" in row]
    return figures


def table(results: dict, a: argparse.Namespace) -> str:
    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    rows = {}
    for method, r in results.items():
        s = r["steps"]
        rows[method] = {
            "optimizer steps": len(s),
            "training seconds": r["train_s"],
            "seconds per step": mean([x["generation_s"] + x["update_s"] for x in s]),
            "  generation + scoring": mean([x["generation_s"] for x in s]),
            "    no-grad log-probs (old/ref)": mean([x["no_grad_logps_s"] for x in s]),
            "  update": mean([x["update_s"] for x in s]),
            "completions in no-grad forwards per step": round(mean([x["no_grad_logps_rows"] for x in s])),
            "completions trained per step": a.prompts * (a.m if method == "pods" else a.n),
            "update peak memory MB": max(x["peak_mb"] for x in s),
            "update memory rise MB": max(x["rise_mb"] for x in s),
            "train reward, all n (last 5 steps)": mean(r["rewards"][-5:]),
            f"held-out accuracy ({a.eval_problems}, greedy)": r["accuracy"],
        }
    g, p = rows["grpo"], rows["pods"]
    base = results["grpo"].get("base_accuracy")
    lines = [
        f"TRL GRPOTrainer (n={a.n}, all trained) vs PODSTrainer (n={a.n}, m={a.m}, max-variance); arithmetic "
        f"({a.digits} digit, '{a.operations}'), {a.model}, {a.prompts} prompts/step, loss_type={a.loss_type}, "
        f"lr={a.lr}, beta={a.beta}, gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}, "
        f"budget {a.budget_s:.0f} s of training each",
        (f"base model held-out accuracy: {base:.3f}" if base is not None else ""),
        f"{'':<40} {'grpo':>12} {'pods':>12} {'pods/grpo':>10}",
    ]
    for key in g:
        ratio = p[key] / g[key] if g[key] else float("nan")
        fmt = "{:>12.0f}" if isinstance(g[key], int) or "MB" in key else "{:>12.3f}"
        lines.append(f"{key:<40} {fmt.format(g[key])} {fmt.format(p[key])} {ratio:>10.2f}")
    return "\n".join(line for line in lines if line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=600, help="training seconds per method")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step")
    parser.add_argument("--n", type=int, default=32, help="completions generated per prompt")
    parser.add_argument("--m", type=int, default=8, help="completions PODS trains per prompt")
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--operations", default="+-*")
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--loss-type", default="grpo", help="TRL loss_type for both (TRL's default is dapo)")
    parser.add_argument("--beta", type=float, default=0.0,
                        help="KL coefficient (TRL's default 0.0); > 0 adds the reference model's no-grad forwards")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="TRL's default; off here, as in podsrl's own benchmarks")
    parser.add_argument("--train-problems", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/podsrl-trl-bench")
    parser.add_argument("--out", help="also write the table and every figure (JSON) to OUT.txt / OUT.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--eval-base", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print("RESULT " + json.dumps(run(a.child, a)))
        return
    results = {}
    for i, method in enumerate(METHODS):
        argv = [sys.executable, __file__, *sys.argv[1:], "--child", method] + (["--eval-base"] if i == 0 else [])
        print(f"running {method} for {a.budget_s:.0f} s ...", file=sys.stderr, flush=True)
        out = subprocess.run(argv, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{method} failed:\n{out.stderr[-4000:]}")
        results[method] = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))[7:])
    text = table(results, a)
    print(text)
    if a.out:
        with open(a.out + ".txt", "w") as f:
            f.write(text + "\n")
        with open(a.out + ".json", "w") as f:
            json.dump({"settings": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
