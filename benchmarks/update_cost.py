"""The default run's step cost against an earlier release's, side by side in one run.

    python benchmarks/update_cost.py [--baseline 5d056c0] [--rounds 4] [--out benchmarks/results/update_cost]

Trains the embedded default's first step with this checkout's code and with the code of
``--baseline`` (its ``src/`` taken from git), alternately, ``--rounds`` times each, one OpenMP
thread, 4 held-out problems (the evaluations at the start and the end are not timed). The first
step starts from the same weights with the same seed, so both versions train on the same
rollouts and do the same work but for what changed in the update. Printed per version: the
median over rounds of the step's CPU seconds (the training process), of its update's wall
seconds, and of the update's peak memory; and the ratios current / baseline.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from podsrl.errors import ArgumentParser, PodsError, one_line_errors

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("step_cpu_s", "update_s", "update_peak_memory_mb")


def baseline_source(rev: str, into: Path) -> Path:
    """``src/`` of ``rev``, unpacked under ``into``."""
    try:
        archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise PodsError(f"cannot read {rev!r} from git: {getattr(e, 'stderr', b'').decode().strip() or e}") from None
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def first_step(src: Path, out: Path) -> dict:
    """Train the default's first step with the package under ``src``; its cost."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "podsrl", "train", "steps=1", "task.test_size=4", "threads=1", "progress=false",
               f"output_dir={out}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise PodsError(f"training with {src} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    step = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("step") == 1
                and "update_s" in r)
    return {"step_cpu_s": step["train_cpu_seconds"], "update_s": step["update_s"],
            "update_peak_memory_mb": step["update_peak_memory_mb"]}


@one_line_errors("update_cost.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="update_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="5d056c0", help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "update_cost")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"baseline": baseline_source(args.baseline, Path(tmp) / "baseline"), "current": ROOT / "src"}
        runs = {name: [] for name in versions}
        for r in range(args.rounds):
            for name in (list(versions) if r % 2 == 0 else list(versions)[::-1]):  # alternate who goes first
                runs[name].append(first_step(versions[name], Path(tmp) / f"{name}-{r}"))
                print(f"round {r}: {name:8s} " + "  ".join(f"{k}={runs[name][-1][k]:.2f}" for k in FIELDS), flush=True)
    median = {name: {k: statistics.median(x[k] for x in rs) for k in FIELDS} for name, rs in runs.items()}
    ratios = {k: median["current"][k] / median["baseline"][k] for k in FIELDS}
    lines = [f"baseline {args.baseline}, {args.rounds} rounds each, medians:",
             f"{'':10s}" + "".join(f"{k:>24s}" for k in FIELDS)]
    lines += [f"{name:10s}" + "".join(f"{median[name][k]:24.2f}" for k in FIELDS) for name in median]
    lines.append(f"{'ratio':10s}" + "".join(f"{ratios[k]:24.3f}" for k in FIELDS))
    print("\n".join(lines))
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "update_cost.txt").write_text("\n".join(lines) + "\n")
        (args.out / "update_cost.json").write_text(json.dumps({"baseline": args.baseline, "runs": runs,
                                                               "median": median, "ratio": ratios}, indent=1))
    except OSError as e:
        raise PodsError(f"cannot write {args.out}: {e.strerror}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
