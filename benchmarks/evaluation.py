"""Held-out evaluation speed: greedy pass@1 on a task's held-out problems (default: 500 two-digit
``+ -`` problems), with the HF engine's settings side by side in one run; ratios against the first
row run (by default transformers' ``generate`` on whole prompts; ``--rows`` picks rows of the table).

    python benchmarks/evaluation.py [--config configs/arithmetic_2digit.yaml] [--repeats 2] [--rows 3,4] [key=value ...]

Rows: ``generate`` (every row runs until the last one ends, each prompt prefilled whole); ``loop``
without the shared prefix (``rollout.share_prompt_cache=false``: each prompt prefilled whole, rows
leave the batch as they end); ``loop`` with the shared prefix (the default: the chat template and
system prompt that every prompt starts with are prefilled once per batch); the default at 512 rows
per call; the default with every generate call padded to the longest prompt of the evaluation (as
before calls were padded to their own longest, which with prompts of one length changes nothing);
the default under bf16 autocast (what ``mixed_precision=bf16`` gives), whose completions
differ from float32's where greedy decoding meets a near tie. Each row gives its best time of
``--repeats`` evaluations after a warm-up, the accuracy, and the share of completions identical to
the first row's.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from podsrl import models
from podsrl.config import load_config
from podsrl.evaluate import evaluate
from podsrl.rollout import hf
from podsrl.rollout.hf import HFEngine
from podsrl.tasks import task_from_config

ROWS = [  # label, engine options, autocast dtype
    ("generate, whole prompts", dict(decoder="generate", share_prompt_cache=False), None),
    ("loop, whole prompts", dict(decoder="loop", share_prompt_cache=False), None),
    ("loop, shared prefix (default)", dict(decoder="loop"), None),
    ("the default, every call padded to the longest prompt of all", dict(decoder="loop", pad_to_longest=True), None),
    ("loop, shared prefix, 512 rows", dict(decoder="loop", batch_size=512), None),
    ("loop, shared prefix, bf16 autocast", dict(decoder="loop"), torch.bfloat16),
]


@contextlib.contextmanager
def padded_to_longest():
    """The HF engine as it was before each call's prompts were padded only to its own longest: every
    call padded to the longest prompt of the evaluation."""
    own = hf.call_width
    hf.call_width = lambda mask, multiple, padding_side: mask.shape[1]
    try:
        yield
    finally:
        hf.call_width = own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/arithmetic_2digit.yaml")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", default=None, help="comma-separated row numbers of the table (1-based; default: all)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    c = load_config(args.config, args.overrides)
    tok = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype)
    task = task_from_config(c.task)
    system = task.system_prompt if c.task.system_prompt is None else c.task.system_prompt
    print(f"{len(task.test)} held-out problems of {c.task.name}, max_new_tokens={c.rollout.max_new_tokens}, "
          f"{torch.get_num_threads()} threads, model {c.model.name_or_path} ({c.model.dtype})")
    print(f"| setting | seconds | vs first | problems/s | accuracy | same completions |\n|---|---|---|---|---|---|")
    first = None
    chosen = [ROWS[int(i) - 1] for i in args.rows.split(",")] if args.rows else ROWS
    for label, options, dtype in chosen:
        options = dict(options)
        pad_to_longest = options.pop("pad_to_longest", False)
        engine = HFEngine(model, tok, **{"batch_size": 128, **options})
        autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
        best = float("inf")
        with autocast, (padded_to_longest() if pad_to_longest else contextlib.nullcontext()):
            evaluate(engine, tok, task.test[:8], system, c.rollout.max_new_tokens)  # warm-up
            for _ in range(args.repeats):
                t = time.perf_counter()
                result = evaluate(engine, tok, task.test, system, c.rollout.max_new_tokens, keep=len(task.test))
                best = min(best, time.perf_counter() - t)
        texts = [s["completion"] for s in result.samples]
        if first is None:
            first = (best, texts)
        same = sum(a == b for a, b in zip(texts, first[1])) / len(texts)
        print(f"| {label} | {best:.1f} | {first[0] / best:.2f}x | {len(texts) / best:.0f} | "
              f"{result.accuracy:.3f} | {same:.3f} |", flush=True)


if __name__ == "__main__":
    main()
