"""``save_rollouts``: every completion a run samples, kept in its folder, so that ``replay=true``
trains the logged steps again on them without generating, on any machine.

A generate call's rows are keyed by prompt, seed and row number: the key a row's sampling depends
on. :class:`RolloutLog` wraps the run's engine. It appends each call's completions to
``rollouts.jsonl`` (token ids up to and including the first EOS, the call's padded widths, and the
sampler's log-probs and nuclei where the engine gives them). While ``serving``, a call whose rows
are all recorded is answered from the file: the same token ids, padded to the same widths, so
that the update sees the tensors the run trained on; a later line for a key wins over an earlier.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from podsrl.checkpoint import read_jsonl
from podsrl.rollout import Rollouts

FILE = "rollouts.jsonl"


def prompt_digest(prompt: str) -> str:
    """A short stand-in for a prompt in a row's key (its SHA-256, 16 hex digits)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def row_keys(prompts: list[str], n: int, seeds: list[int] | None, first_row: int) -> list[tuple]:
    """The key of each of a call's ``len(prompts) * n`` rows, in order (None: an unseeded call)."""
    if seeds is None:
        return [None] * (len(prompts) * n)
    return [(prompt_digest(p), seed, first_row + j) for p, seed in zip(prompts, seeds) for j in range(n)]


def read_rows(path: Path) -> dict[tuple, dict]:
    """Each recorded row by key: ``ids``, and ``logp`` and ``support`` where recorded, with its
    call's ``width`` and ``prompt_width``. A last line cut short (a killed write) is dropped."""
    if not path.exists():
        return {}
    rows = {}
    for call in read_jsonl(path, "podsrl rollout log", "keys", list):
        rows.update(call_rows(call))
    return rows


def call_rows(call: dict) -> dict[tuple, dict]:
    """A recorded call's rows by key, each with its call's widths."""
    return {tuple(key): {"ids": call["ids"][i], "width": call["width"], "prompt_width": call["prompt_width"],
                         "logp": call["logp"][i] if call.get("logp") else None,
                         "support": call["support"][i] if call.get("support") else None}
            for i, key in enumerate(call["keys"])}


class RolloutLog:
    """Wraps an engine (``generate``, ``sync_weights``, ``phase``, ``eos_ids``): records every
    seeded call's completions to ``path``, and while ``serving`` answers a call whose rows are all
    recorded from them instead of generating."""

    def __init__(self, engine, tokenizer, path: Path, device):
        self.engine, self.tokenizer, self.path, self.device = engine, tokenizer, path, device
        self.rows = read_rows(path)
        self.serving = False
        """Set by the trainer while it replays logged steps."""
        self.generated = 0
        """Rows the engine generated (not answered from the file)."""

    @property
    def eos_ids(self):
        return getattr(self.engine, "eos_ids", ())

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def phase(self):
        return self.engine.phase()

    def generate(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
                 seeds: list[int] | None = None, on_chunk=None, first_row: int = 0) -> Rollouts:
        keys = row_keys(prompts, n, seeds, first_row)
        if self.serving and keys and all(k is not None and k in self.rows for k in keys):
            out = self._recorded(prompts, n, keys)
            if on_chunk is not None:
                on_chunk(0, out.texts, [self.rows[k]["ids"] for k in keys])
            return out
        out = self.engine.generate(prompts, n, temperature, max_new_tokens, seeds=seeds, on_chunk=on_chunk,
                                   first_row=first_row)
        self.generated += len(keys)
        if seeds is not None:
            self._append(keys, out)
        return out

    def _append(self, keys: list[tuple], out: Rollouts) -> None:
        mask = out.completion_mask.bool().cpu()
        call = {"keys": keys, "width": out.completion_ids.shape[1], "prompt_width": out.prompt_ids.shape[1],
                "ids": [row[m].tolist() for row, m in zip(out.completion_ids.cpu(), mask)]}
        if out.sampler_logp is not None:
            call["logp"] = [row[m].tolist() for row, m in zip(out.sampler_logp.cpu(), mask)]
        if out.sampler_support is not None:
            call["support"] = [row[m].tolist() for row, m in zip(out.sampler_support.cpu(), mask)]
        with open(self.path, "a") as f:
            f.write(json.dumps(call) + "\n")
        self.rows.update(call_rows(call))

    def _recorded(self, prompts: list[str], n: int, keys: list[tuple]) -> Rollouts:
        """The call's rollouts rebuilt from the file: prompts encoded as the engines encode them
        (left-padded to the recorded width), completions padded to the recorded width."""
        pad = self.tokenizer.pad_token_id
        rows = [self.rows[k] for k in keys]
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        extra = max(r["prompt_width"] for r in rows) - enc["input_ids"].shape[1]  # the engine's padding to a multiple
        prompt_ids = F.pad(enc["input_ids"], (extra, 0), value=pad).repeat_interleave(n, 0)
        prompt_mask = F.pad(enc["attention_mask"], (extra, 0), value=0).repeat_interleave(n, 0)
        width = max(r["width"] for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["ids"])] = torch.tensor(r["ids"], dtype=torch.long)
            mask[i, : len(r["ids"])] = 1
        logp = support = None
        if all(r["logp"] is not None for r in rows):
            logp = torch.zeros((len(rows), width))
            for i, r in enumerate(rows):
                logp[i, : len(r["logp"])] = torch.tensor(r["logp"])
        if all(r["support"] is not None for r in rows):
            k = max((len(s) for r in rows for s in r["support"]), default=1)
            support = torch.full((len(rows), width, k), -1, dtype=torch.int32)
            for i, r in enumerate(rows):
                for t, s in enumerate(r["support"]):
                    support[i, t, : len(s)] = torch.tensor(s, dtype=torch.int32)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        to = (lambda t: None if t is None else t.to(self.device))
        return Rollouts(to(prompt_ids), to(prompt_mask), to(ids), to(mask), texts, to(logp), to(support))
