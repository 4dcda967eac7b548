"""Page faults of a CPU evaluation with glibc's default heap against a heap that keeps what it
frees: the same ``podsrl eval`` run twice, side by side, once as it is and once with
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<64 GiB>`` (glibc's documented tunables, mallopt(3)).

    python benchmarks/heap.py [--problems 64] [--out benchmarks/results/heap/heap.md] [-- OVERRIDES...]

By default glibc serves each allocation over 32 MiB with a fresh mmap, and gives large freed
blocks back to the system; every large tensor is then new memory, which the kernel faults in and
zeroes page by page. A decoding step of the HF engine makes such tensors for every layer (the KV
cache grows by a copy), so a CPU run spends part of its time in the kernel. With the two settings
big blocks come from the heap, and freed ones stay there for the next tensor of that size.

What it reports, for the whole process (model and task loading included): minor page faults,
kernel (system) and user CPU seconds, the peak resident set, and whether the two runs' completions
are the same text (where the heap is, is not what is computed: torch aligns its buffers to 64
bytes either way). Page faults are counts, whatever the machine's load; CPU seconds bend with the
load, and the wall clock more: time the saving on a quiet machine only.

The peak resident set it reports is this evaluation's (64 problems, one generate call). Where the
KV cache grows through many longer calls, each larger block is new memory that the freed smaller
ones cannot serve, and the kept heap holds far more: a list_functions screening run's process (128
rows a call, 500 problems) held gigabytes more while it evaluated, and two such runs side by side
came close to exhausting a 24 GiB machine; two of the list_functions confirmation's runs held
10.7 and 12.2 GiB by step 10 and exhausted it. So no driver of this repository sets it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from podsrl.checkpoint import write_atomic

ROOT = Path(__file__).resolve().parent.parent
KEEP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 * 2**30)}
EVAL = ["configs/screening_gym.yaml", "task.dataset=list_functions", "rollout.max_new_tokens=64", "threads=1",
        "progress=false"]


def measure(problems: int, overrides: list[str], heap: dict[str, str]) -> dict:
    """One ``podsrl eval`` in a child process: its resource usage and its completions."""
    env = {k: v for k, v in os.environ.items() if k not in KEEP} | heap
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "podsrl", "eval", *EVAL, f"task.test_size={problems}",
                                  f"log_completions={problems}", *overrides], cwd=ROOT, env=env, stdout=out, stderr=err)
        # this child's own usage: RUSAGE_CHILDREN's peak resident set is the largest of all children so far
        _, status, usage = os.wait4(child.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code != 0:
        sys.exit(f"podsrl eval failed (exit code {code}): {stderr.strip().splitlines()[-1:]}")
    report = json.loads(stdout.strip().splitlines()[-1])
    return {"faults": usage.ru_minflt, "system_s": usage.ru_stime, "user_s": usage.ru_utime,
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "accuracy": report["accuracy"], "completions": [s["completion"] for s in report["completions"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=64, help="held-out problems evaluated (default 64)")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.add_argument("overrides", nargs="*", help="config overrides for both runs (after --)")
    args = parser.parse_args(argv)
    default, kept = measure(args.problems, args.overrides, {}), measure(args.problems, args.overrides, KEEP)
    rows = [("minor page faults", "faults", "{:,.0f}"), ("system CPU s", "system_s", "{:.1f}"),
            ("user CPU s", "user_s", "{:.1f}"), ("peak resident set, MiB", "peak_rss_mib", "{:.0f}")]
    lines = [f"`podsrl eval` of {args.problems} list_functions held-out problems, greedy, 64 tokens, one thread "
             f"(`python benchmarks/heap.py --problems {args.problems}`):", "",
             "| | glibc's default | heap kept | default / kept |", "|---|---|---|---|"]
    for label, key, form in rows:
        ratio = default[key] / kept[key] if kept[key] else float("nan")
        lines.append(f"| {label} | {form.format(default[key])} | {form.format(kept[key])} | {ratio:.2f}x |")
    system_share = [r["system_s"] / (r["system_s"] + r["user_s"]) for r in (default, kept)]
    same = default["completions"] == kept["completions"]
    lines += ["", f"System time, share of the CPU time: {system_share[0]:.1%} (default), {system_share[1]:.1%} (kept).",
              f"Completions the same text in both runs: {'yes' if same else 'no'} ({len(default['completions'])}); "
              f"accuracy {default['accuracy']:.3f} and {kept['accuracy']:.3f}.",
              "CPU seconds bend with the machine's load (page faults do not); time the saving on a quiet machine."]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        write_atomic(Path(args.out), text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
