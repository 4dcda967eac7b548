"""Step time with generation and update at once (``async_lag=1``) against the synchronous trainer.

    python benchmarks/async_step.py [--steps 10] [--out benchmarks/results/async_step]
    python benchmarks/async_step.py --pilot     # GRPO (n = 8) at threads 2 and 1: the reference's threads
    python benchmarks/async_step.py --variants gpu --out benchmarks/results/async_step_gpu   # on a GPU

The two-digit confirmation's settings (``evidence_confirm_a_arithmetic_2digit/task.yaml`` with its
PODS overrides: n = 32, m = 8, 4 prompts per step, lr 1e-5), seed 0 (the same prompts for every
variant), trained for one warm-up step and ``--steps`` more, one variant after the other:

* ``sync-2``: the synchronous trainer, threads = 2;
* ``sync-1``: the synchronous trainer, threads = 1;
* ``async-1+1``: ``async_lag=1``, one thread for the trainer and one for the generation worker.

A step's time is the growth of ``train_seconds`` (wall time of the step's phases, evaluation
excluded) between two steps. Prints, per variant, the mean and median step after the warm-up and
their split (the worker's generation runs beside the update: there the trainer's wait for it is
the part on the clock), then the ratios of the asynchronous mean step to each synchronous one.
Run it on a quiet machine: every figure is wall time. Writes ``summary.txt``, ``summary.json``
and each variant's ``metrics.jsonl`` to ``--out``.

``--variants gpu``: ``configs/compare_gpu.yaml``'s PODS (n = 64, m = 16), synchronous (``lag-0``)
against ``async_lag=1`` (``lag-1``, the worker on the same GPU), each with the device's defaults.
``key=value`` arguments are added to every variant's settings (the GPU suite's dry run gives a tiny
model and sizes).

``--pilot``: the pilot that fixes the thread count of the clock confirmation's reference,
synchronous GRPO (n = 8, the same settings otherwise): threads = 2 and threads = 1, the same steps;
the one with the shorter mean step is the reference's (``pilot.txt``, ``pilot.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
from podsrl.errors import ArgumentParser, PodsError, one_line_errors  # noqa: E402

CONFIG = REPO / "benchmarks" / "results" / "evidence_confirm_a_arithmetic_2digit" / "task.yaml"
SETTINGS = ["mode=pods", "lr=1e-5", "prompts_per_step=4", "n=32", "m=8", "seed=0", "task.test_size=20", "progress=false"]
VARIANTS = {"sync-2": ["threads=2"], "sync-1": ["threads=1"],
            "async-1+1": ["async_lag=1", "threads=1", "async_worker_threads=1"]}
GPU_CONFIG = REPO / "configs" / "compare_gpu.yaml"
GPU_SETTINGS = ["mode=pods", "seed=0", "task.test_size=20", "progress=false"]
GPU_VARIANTS = {"lag-0": ["async_lag=0"], "lag-1": ["async_lag=1"]}
PILOT = {"grpo-sync-2": ["mode=grpo", "n=8", "m=8", "threads=2"], "grpo-sync-1": ["mode=grpo", "n=8", "m=8", "threads=1"]}


def run(name: str, overrides: list[str], steps: int, folder: Path, config: Path = CONFIG,
        settings: list[str] = SETTINGS) -> list[dict]:
    out = folder / name
    given = {o.partition("=")[0] for o in overrides}  # a variant's setting replaces the common one
    command = [sys.executable, "-m", "podsrl", "train", str(config), *(o for o in settings if o.partition("=")[0] not in given),
               *overrides, f"steps={steps + 1}", f"output_dir={out}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise PodsError(f"{name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def split(rows: list[dict]) -> dict:
    """Mean and median step after the warm-up, and the mean of each part."""
    steps = sorted((r for r in rows if "update_s" in r), key=lambda r: r["step"])
    times = [b["train_seconds"] - a["train_seconds"] for a, b in zip(steps, steps[1:])]  # steps 2..
    later = steps[1:]
    mean = lambda key: statistics.fmean(r.get(key) or 0.0 for r in later)
    return {"steps": len(times), "mean_step_s": statistics.fmean(times), "median_step_s": statistics.median(times),
            "generation_s": mean("generation_s"), "scoring_s": mean("scoring_s"), "update_s": mean("update_s"),
            "wait_s": mean("async/wait_s"), "lag": sorted({r.get("async/lag") for r in later} - {None})}


def device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def table(results: dict) -> list[str]:
    return ["| variant | mean step s | median step s | generation s | scoring s | update s | trainer's wait s | lag |",
            "|---|---|---|---|---|---|---|---|"] + [
        f"| {name} | {r['mean_step_s']:.2f} | {r['median_step_s']:.2f} | {r['generation_s']:.2f} | {r['scoring_s']:.2f} | "
        f"{r['update_s']:.2f} | {r['wait_s']:.2f} | {','.join(map(str, r['lag'])) or '-'} |" for name, r in results.items()]


def write_pilot(results: dict, args) -> int:
    threads = 2 if results["grpo-sync-2"]["mean_step_s"] <= results["grpo-sync-1"]["mean_step_s"] else 1
    text = "\n".join([f"GRPO n = 8, 4 prompts per step, seed 0; {args.steps} steps after one warm-up step; "
                      f"{os.cpu_count()} cores", "", *table(results), "",
                      f"the reference's threads: {threads} (the shorter mean step)"]) + "\n"
    print(text)
    (args.out / "pilot.txt").write_text(text)
    (args.out / "pilot.json").write_text(json.dumps({"variants": results, "reference_threads": threads}, indent=2) + "\n")
    return 0


@one_line_errors("async_step.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps timed after the warm-up step")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "async_step")
    parser.add_argument("--pilot", action="store_true", help="GRPO at threads 2 and 1 (the reference's thread count)")
    parser.add_argument("--variants", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="added to every variant's settings")
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise PodsError(f"{bad[0]!r} is not a key=value setting")
    if args.steps < 2:
        raise PodsError(f"--steps must be >= 2, got {args.steps}")
    if args.out.exists() and not args.out.is_dir():
        raise PodsError(f"--out {args.out} is a file")
    results = {}
    gpu = args.variants == "gpu"
    variants = PILOT if args.pilot else GPU_VARIANTS if gpu else VARIANTS
    config, settings = (GPU_CONFIG, GPU_SETTINGS) if gpu else (CONFIG, SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in variants.items():
            print(f"{name}: {' '.join(overrides)}", flush=True)
            rows = run(name, [*args.overrides, *overrides], args.steps, Path(tmp), config, settings)
            results[name] = split(rows)
            keep = args.out / name
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / name / "metrics.jsonl", keep / "metrics.jsonl")
    if args.pilot:
        return write_pilot(results, args)
    what = (f"{GPU_CONFIG.name}'s PODS" if gpu else "PODS n = 32, m = 8, 4 prompts per step") + f", seed 0"
    lines = [f"{what}; {args.steps} steps after one warm-up step; {os.cpu_count()} cores; {device()}"
             + (f"; {' '.join(args.overrides)}" if args.overrides else ""), "", *table(results)]
    lagged, references = ("lag-1", ("lag-0",)) if gpu else ("async-1+1", ("sync-2", "sync-1"))
    ratios = {ref: results[lagged]["mean_step_s"] / results[ref]["mean_step_s"] for ref in references}
    lines += ["", *(f"{lagged} mean step / {ref}: {ratio:.2f}x" for ref, ratio in ratios.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.txt").write_text(text)
    (args.out / "summary.json").write_text(json.dumps({"variants": results, "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
