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

from podsrl.errors import PodsError, first_line


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = sorted((output_dir / "checkpoints").glob("step-*"))
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    """``{"step": ..., "train_seconds": ..., "sampling": ...}`` of a checkpoint (the sampler's
    state: prompts taken from the stream, per-prompt history; absent in older checkpoints)."""
    return json.loads((checkpoint / "trainer_state.json").read_text())


def load_optimizer(optimizer, checkpoint: Path, lr: float, weight_decay: float) -> None:
    """The optimizer's state from a checkpoint, under the run's current ``lr`` and
    ``weight_decay`` (the state dict carries the values it was saved with)."""
    try:
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True))
    except (ValueError, RuntimeError, KeyError) as e:
        raise PodsError(f"checkpoint {checkpoint} does not match the model's trainable weights: {first_line(e)}") from None
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = lr, weight_decay


def load_weights(model, folder: Path, lora: bool) -> None:
    """Load a checkpoint's weights (an adapter, or the full model) into ``model``."""
    from safetensors.torch import load_file

    try:
        if lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
            return
        files = sorted(folder.glob("*.safetensors"))
        state = {k: v for f in files for k, v in load_file(f).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
    except (RuntimeError, OSError, ValueError) as e:  # another LoRA rank, a full model for an adapter, ...
        raise PodsError(f"checkpoint {folder} does not match the model: {first_line(e)}") from None
    if unexpected or [k for k in missing if "lm_head" not in k]:  # tied heads are not saved
        raise PodsError(f"checkpoint {folder} does not match the model")


def save_checkpoint(s, step: int, keep: int = 1) -> None:
    """Write the checkpoint of ``step`` for the run ``s`` (a trainer Setup); keep the last ``keep``.
    A write that fails (a full disk, say) leaves the previous checkpoint as it was and raises
    PodsError on every process."""
    acc = s.accelerator
    acc.wait_for_everyone()
    state_dict = acc.get_state_dict(s.model)
    error = None
    if acc.is_main_process:
        root = s.output_dir / "checkpoints"
        final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            acc.unwrap_model(s.model).save_pretrained(tmp / "model", state_dict=state_dict)
            s.tokenizer.save_pretrained(tmp / "model")
            torch.save(s.optimizer.state_dict(), tmp / "optimizer.pt")
            state = {"step": step, "train_seconds": s.train_seconds, "sampling": s.sampler.state_dict()}
            (tmp / "trainer_state.json").write_text(json.dumps(state))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
            shutil.rmtree(tmp, ignore_errors=True)
            error = f"cannot write the checkpoint of step {step} to {root}: {getattr(e, 'strerror', None) or first_line(e)}"
        else:
            for old in sorted(root.glob("step-*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    if acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error])[0]
    if error is not None:
        raise PodsError(error)
    acc.wait_for_everyone()


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (or another per-step log): one JSON object per line,
    each with its ``step``. A last line cut short (the process was killed while writing it) is
    dropped; any other line that is not such a record is an error naming the file and line."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise PodsError(f"{path}: not a podsrl log (not UTF-8 text)") from None
    except OSError as e:
        raise PodsError(f"cannot read {path}: {e.strerror or e}") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: a write cut short
                break
            raise PodsError(f"{path}:{number}: not a podsrl log record ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise PodsError(f"{path}:{number}: not a podsrl log record (no step)")
        records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop the lines of steps after the checkpoint (they will be redone), and a last
    line cut short."""
    if not path.exists():
        return
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in read_metrics(path) if r["step"] <= step))



def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
