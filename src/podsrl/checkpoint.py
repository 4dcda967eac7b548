"""Checkpoints: ``checkpoints/step-NNNNNN/{model/, optimizer.pt, trainer_state.json}``.

A checkpoint is written to a temporary folder and renamed into place, so it is complete or
absent. ``model/`` is what ``save_pretrained`` writes (a LoRA adapter, or the full model) plus the
tokenizer, loadable by transformers, peft and ``podsrl eval`` as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from podsrl.errors import PodsError


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = sorted((output_dir / "checkpoints").glob("step-*"))
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    """``{"step": ..., "train_seconds": ...}`` of a checkpoint."""
    return json.loads((checkpoint / "trainer_state.json").read_text())


def load_optimizer(optimizer, checkpoint: Path) -> None:
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True))


def load_weights(model, folder: Path, lora: bool) -> None:
    """Load a checkpoint's weights (an adapter, or the full model) into ``model``."""
    from safetensors.torch import load_file

    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
    else:
        files = sorted(folder.glob("*.safetensors"))
        state = {k: v for f in files for k, v in load_file(f).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # tied heads are not saved
            raise PodsError(f"checkpoint {folder} does not match the model")


def save_checkpoint(s, step: int, keep: int = 1) -> None:
    """Write the checkpoint of ``step`` for the run ``s`` (a trainer Setup); keep the last ``keep``."""
    acc = s.accelerator
    acc.wait_for_everyone()
    state_dict = acc.get_state_dict(s.model)
    if acc.is_main_process:
        root = s.output_dir / "checkpoints"
        final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        acc.unwrap_model(s.model).save_pretrained(tmp / "model", state_dict=state_dict)
        s.tokenizer.save_pretrained(tmp / "model")
        torch.save(s.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "train_seconds": s.train_seconds}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop the lines of steps after the checkpoint (they will be redone)."""
    if not path.exists():
        return
    lines = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= step]
    write_atomic(path, "".join(l + "\n" for l in lines))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
