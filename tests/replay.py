"""Record one run's rollouts and replay them in another, so that equivalence tests (two processes
against one, FSDP or ZeRO-2 against DDP) compare updates on the same rollouts.

Sampling is seeded per prompt and row, but a sampled token can still flip between two runs whose
logits differ by rounding (a batch split over processes, another CPU's kernels): a test that needs
both runs to sample the same tokens tests the machine's rounding, not the training. Here the
reference run records every completion under its key (prompt, seed, row number); the compared run
still generates with its own engine (so the engine runs as it would), then trains on the recorded
completion of each key it finds, and on its own where the reference has none. Scoring sees the
replayed completions too.

A worker turns it on with the environment: ``PODSRL_RECORD_ROLLOUTS=DIR`` writes
``DIR/rank<R>.jsonl``; ``PODSRL_REPLAY_ROLLOUTS=DIR`` reads every file there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from podsrl.rollout import Rollouts


def _key(prompt: str, seed: int | None, row: int) -> str:
    return json.dumps([prompt, seed, row])


def _rows(prompts, n, seeds, first_row):
    """The key of each of the call's ``len(prompts) * n`` rows, in order."""
    return [_key(p, None if seeds is None else seeds[i], first_row + j) for i, p in enumerate(prompts) for j in range(n)]


class Recording:
    """Wraps an engine: every completion it generates is appended to ``folder/rank<R>.jsonl``."""

    def __init__(self, engine, folder: str):
        self.engine, self.path = engine, Path(folder) / f"rank{os.environ.get('RANK', '0')}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def generate(self, prompts, n, temperature, max_new_tokens, seeds=None, on_chunk=None, first_row=0) -> Rollouts:
        out = self.engine.generate(prompts, n, temperature, max_new_tokens, seeds=seeds, on_chunk=on_chunk, first_row=first_row)
        logps = out.sampler_logp if out.sampler_logp is not None else [None] * len(out.texts)
        with self.path.open("a") as f:
            for key, ids, mask, text, logp in zip(_rows(prompts, n, seeds, first_row), out.completion_ids,
                                                  out.completion_mask, out.texts, logps):
                f.write(json.dumps({"key": key, "ids": ids[mask.bool()].tolist(), "text": text,
                                    "logp": None if logp is None else logp[mask.bool()].tolist()}) + "\n")
        return out

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def phase(self):
        return self.engine.phase()


class Replay:
    """Wraps an engine: each generated row whose key the recording holds is replaced by the
    recorded completion, in what ``on_chunk`` receives and in what ``generate`` returns."""

    def __init__(self, engine, folder: str, pad_id: int):
        self.engine, self.pad_id, self.replayed, self.own = engine, pad_id, 0, 0
        self.recorded = {}
        for path in sorted(Path(folder).glob("rank*.jsonl")):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self.recorded[row["key"]] = (row["ids"], row["text"], row.get("logp"))

    def generate(self, prompts, n, temperature, max_new_tokens, seeds=None, on_chunk=None, first_row=0) -> Rollouts:
        keys = _rows(prompts, n, seeds, first_row)

        def replaced_chunk(first, texts, ids):
            rows = keys[first * n : first * n + len(texts)]
            texts = [self.recorded[k][1] if k in self.recorded else t for k, t in zip(rows, texts)]
            ids = [self.recorded[k][0] if k in self.recorded else i for k, i in zip(rows, ids)]
            on_chunk(first, texts, ids)

        out = self.engine.generate(prompts, n, temperature, max_new_tokens, seeds=seeds,
                                   on_chunk=replaced_chunk if on_chunk else None, first_row=first_row)
        ids = [self.recorded[k][0] if k in self.recorded else row[mask.bool()].tolist()
               for k, row, mask in zip(keys, out.completion_ids, out.completion_mask)]
        texts = [self.recorded[k][1] if k in self.recorded else t for k, t in zip(keys, out.texts)]
        logps = None
        if out.sampler_logp is not None:  # the sampler's log-probs of the recorded tokens, where recorded
            logps = [self.recorded[k][2] if k in self.recorded else row[mask.bool()].tolist()
                     for k, row, mask in zip(keys, out.sampler_logp, out.completion_mask)]
        self.replayed += sum(k in self.recorded for k in keys)
        self.own += sum(k not in self.recorded for k in keys)
        width = max(1, max(len(i) for i in ids))
        completion_ids = torch.full((len(ids), width), self.pad_id, dtype=out.completion_ids.dtype)
        completion_mask = torch.zeros((len(ids), width), dtype=out.completion_mask.dtype)
        for r, row in enumerate(ids):
            completion_ids[r, : len(row)] = torch.tensor(row, dtype=completion_ids.dtype)
            completion_mask[r, : len(row)] = 1
        sampler_logp = None
        if logps is not None:
            sampler_logp = torch.zeros(completion_ids.shape)
            for r, row in enumerate(logps):
                sampler_logp[r, : len(row)] = torch.tensor(row)
        device = out.completion_ids.device
        return Rollouts(out.prompt_ids, out.prompt_mask, completion_ids.to(device), completion_mask.to(device), texts,
                        None if sampler_logp is None else sampler_logp.to(device))

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def phase(self):
        return self.engine.phase()


def install(trainer) -> None:
    """Have ``trainer.make_engine`` wrap the engine it builds as the environment asks (the
    wrappers built are kept in ``engines``)."""
    record, replay = os.environ.get("PODSRL_RECORD_ROLLOUTS"), os.environ.get("PODSRL_REPLAY_ROLLOUTS")
    if not (record or replay):
        return
    real = trainer.make_engine

    def make_engine(name, model, tokenizer, config, *args, **kwargs):
        engine = real(name, model, tokenizer, config, *args, **kwargs)
        wrapped = Recording(engine, record) if record else Replay(engine, replay, tokenizer.pad_token_id)
        engines.append(wrapped)
        return wrapped

    trainer.make_engine = make_engine


engines: list = []  # the wrappers built in this process
