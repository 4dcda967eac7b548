"""Checkpoints: ``checkpoints/step-NNNNNN/{model/, optimizer.pt, trainer_state.json}``
(``optimizer.pt`` where the run keeps its optimizer state: ``save_optimizer``).

A checkpoint is written to a temporary folder and renamed into place, so it is complete or
absent. ``model/`` is what ``save_pretrained`` writes (a LoRA adapter, or the full model) plus the
tokenizer, loadable by transformers, peft and ``podsrl eval`` as it is. ``optimizer.pt`` is the
optimizer's full state keyed by parameter name, gathered from the ranks under FSDP, so a run can
resume on another number of processes, sharded or not.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import torch

from podsrl import sharding
from podsrl.errors import PodsError, first_line, interrupts_deferred, os_reason
from podsrl.pipeline import PENDING

DEEPSPEED, DEEPSPEED_TAG = "deepspeed", "state"
"""Under DeepSpeed the optimizer state is saved by DeepSpeed, one partition per rank, in
``deepspeed/state/`` instead of ``optimizer.pt``; a resumed run needs as many processes."""


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = sorted((output_dir / "checkpoints").glob("step-*"))
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    """``{"step": ..., "train_seconds": ..., "sampling": ...}`` of a checkpoint (the sampler's
    state: prompts taken from the stream, per-prompt history; absent in older checkpoints). A
    checkpoint missing a part, or with an unreadable state, is refused naming what is wrong."""
    missing = [part for part in ("trainer_state.json", "model") if not (checkpoint / part).exists()]
    if missing:
        raise PodsError(f"checkpoint {checkpoint} is damaged: it lacks {', '.join(missing)}")
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PodsError(f"checkpoint {checkpoint} is damaged: cannot read trainer_state.json ({first_line(e)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or \
            not isinstance(state.get("train_seconds"), (int, float)):
        raise PodsError(f"checkpoint {checkpoint} is damaged: trainer_state.json lacks its step and train_seconds")
    saved_optimizer = state.get("optimizer", True)  # written without it where save_optimizer says so
    if saved_optimizer and not (checkpoint / "optimizer.pt").is_file() and not (checkpoint / DEEPSPEED).is_dir():
        raise PodsError(f"checkpoint {checkpoint} is damaged: it lacks optimizer.pt")
    return state


def optimizer_state(model, optimizer) -> dict:
    """The optimizer's full state, keyed by parameter name, on the main process (``{}`` on the
    others): under FSDP each rank holds a shard of it, gathered here."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, _inner(optimizer), options=options)


def load_optimizer(acc, model, optimizer, checkpoint: Path, lr: float, weight_decay: float) -> None:
    """Restore the optimizer state of ``checkpoint``, under the run's current ``lr`` and
    ``weight_decay`` (the state carries the values it was saved with): :func:`optimizer_state`'s,
    read by the main process and sent to the others, each keeping its shard; DeepSpeed's, each
    rank reading its own partition. An older checkpoint's ``optimizer.state_dict()`` (keyed by
    parameter index) loads as it was saved, on every process."""
    deepspeed = (checkpoint / DEEPSPEED).is_dir()
    if deepspeed != sharding.is_deepspeed(acc):
        raise PodsError(f"checkpoint {checkpoint} holds {'DeepSpeed' if deepspeed else 'no DeepSpeed'} optimizer state: "
                        f"resume it {'under' if deepspeed else 'without'} DeepSpeed")
    try:
        if deepspeed:
            model.load_checkpoint(str(checkpoint / DEEPSPEED), tag=DEEPSPEED_TAG, load_module_strict=False,
                                  load_optimizer_states=True, load_lr_scheduler_states=False)
        else:
            _load_optimizer(acc, model, optimizer, checkpoint)
    except (ValueError, RuntimeError, KeyError) as e:
        raise PodsError(f"checkpoint {checkpoint} does not match the model's trainable weights: {first_line(e)}") from None
    for group in _inner(optimizer).param_groups:
        group["lr"], group["weight_decay"] = lr, weight_decay


def _load_optimizer(acc, model, optimizer, checkpoint: Path) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    world = acc.num_processes
    state = _read_optimizer(checkpoint) if acc.is_main_process else {}
    by_index = _by_index(state)
    if world > 1:
        from accelerate.utils import broadcast_object_list

        by_index = broadcast_object_list([by_index])[0]
    if by_index:
        optimizer.load_state_dict(state or _read_optimizer(checkpoint))
        return
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=world > 1)
    set_optimizer_state_dict(model, _inner(optimizer), optim_state_dict=state, options=options)


def _read_optimizer(checkpoint: Path) -> dict:
    try:
        return torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:  # a truncated or foreign file
        raise PodsError(f"checkpoint {checkpoint} is damaged: cannot read optimizer.pt ({first_line(e)})") from None


def _by_index(state: dict) -> bool:
    return any(isinstance(p, int) for g in state.get("param_groups", []) for p in g["params"])


def _inner(optimizer):
    """The torch optimizer under accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def load_weights(model, folder: Path, lora: bool) -> None:
    """Load a checkpoint's weights (an adapter, or the full model) into ``model``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not any(folder.glob("*.safetensors")):
        raise PodsError(f"checkpoint {folder} is damaged: it holds no weights (*.safetensors)")
    try:
        if lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
            return
        files = sorted(folder.glob("*.safetensors"))
        state = {k: v for f in files for k, v in load_file(f).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
    except SafetensorError as e:  # a file cut short
        raise PodsError(f"checkpoint {folder} is damaged: {first_line(e)}") from None
    except (RuntimeError, OSError, ValueError) as e:  # another LoRA rank, a full model for an adapter, ...
        raise PodsError(f"checkpoint {folder} does not match the model: {first_line(e)}") from None
    if unexpected or [k for k in missing if "lm_head" not in k]:  # tied heads are not saved
        raise PodsError(f"checkpoint {folder} does not match the model")


def save_checkpoint(s, step: int, keep: int = 1, with_optimizer: bool = True) -> None:
    """Write the checkpoint of ``step`` for the run ``s`` (a trainer Setup), its optimizer state
    where ``with_optimizer``; keep the last ``keep``.
    A write that fails (a full disk, say) leaves the previous checkpoint as it was and raises
    PodsError on every process."""
    acc = s.accelerator
    root = s.output_dir / "checkpoints"
    final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
    error = None
    # the sampler's state first: an async sampler waits for the steps it generates ahead (and says
    # so if its worker fails meanwhile, before anything is written)
    sampling = s.sampler.state_dict() if acc.is_main_process else None
    if acc.is_main_process:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = _write_error(step, root, e)
    error = _on_every_rank(acc, error)
    state_dict = acc.get_state_dict(s.model)  # whole on the main process, also under FSDP
    optimizer = None
    if with_optimizer and sharding.is_deepspeed(acc):  # every rank writes its partition of the optimizer state
        if error is None:
            s.model.save_checkpoint(str(tmp / DEEPSPEED), tag=DEEPSPEED_TAG, exclude_frozen_parameters=True)
    elif with_optimizer:
        optimizer = optimizer_state(s.model, s.optimizer)
    acc.wait_for_everyone()
    if acc.is_main_process and error is None:
        with interrupts_deferred():  # Ctrl-C during the write acts once the checkpoint is whole
            part = "model/"
            try:
                _share_tied(state_dict, acc.unwrap_model(s.model))
                acc.unwrap_model(s.model).save_pretrained(tmp / "model", state_dict=state_dict)
                s.tokenizer.save_pretrained(tmp / "model")
                if optimizer is not None:
                    part = "optimizer.pt"
                    with open(tmp / part, "wb") as f:  # a file of ours: torch's error then carries the OSError
                        torch.save(optimizer, f)
                part = "trainer_state.json"
                state = {"step": step, "train_seconds": s.train_seconds, "train_cpu_seconds": s.train_cpu_seconds,
                         "sampling": sampling,
                         "optimizer": with_optimizer}
                if hasattr(s.sampler, "save_pending"):  # async_lag: the rollouts generated for the coming steps
                    part = PENDING
                    s.sampler.save_pending(tmp / PENDING)
                    part = "trainer_state.json"
                (tmp / part).write_text(json.dumps(state))
                part = ""
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            except Exception as e:  # noqa: BLE001 (OSError; torch.save's RuntimeError, safetensors' SafetensorError, ...)
                shutil.rmtree(tmp, ignore_errors=True)
                error = _write_error(step, root, e, part)
            else:
                for old in sorted(root.glob("step-*"))[:-keep]:
                    shutil.rmtree(old, ignore_errors=True)
    error = _on_every_rank(acc, error)
    if error is not None:
        raise PodsError(error)
    acc.wait_for_everyone()


def _write_error(step: int, root: Path, e: Exception, part: str = "") -> str:
    """What went wrong writing a checkpoint (``part`` of it): the system's reason where the error
    comes from one (torch.save's "[enforce fail at inline_container.cc]" hides a full disk)."""
    return f"cannot write the checkpoint of step {step} to {root}{f' ({part})' if part else ''}: {_reason(e)}"


def _reason(e: BaseException) -> str:
    """The reason of the first OSError in ``e``'s chain of causes (without the file name, which the
    caller gives), else ``e``'s own message."""
    cause = e
    while cause is not None:
        if isinstance(cause, OSError):
            return os_reason(cause)
        cause = cause.__cause__ or cause.__context__
    return first_line(e)


def _on_every_rank(acc, error: str | None) -> str | None:
    """The main process's ``error``, on every process."""
    if acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error])[0]
    return error


def _share_tied(state_dict: dict, model) -> None:
    """A tied parameter (an input embedding that is also the output layer) is gathered from its
    shards as two tensors; make them one, so that ``save_pretrained`` stores it once, as unsharded."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in state_dict and first.setdefault(id(param), name) != name:
            state_dict[name] = state_dict[first[id(param)]]


def read_jsonl(path: Path, what: str, field: str, kind: type) -> list[dict]:
    """The records a run wrote to ``path``, one JSON object per line, each with ``field`` of type
    ``kind`` (``what`` names the kind of file in errors). A last line cut short (the process was
    killed while writing it) is dropped; any other line that is not such a record is an error
    naming the file and line."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise PodsError(f"{path}: not a {what} (not UTF-8 text)") from None
    except OSError as e:
        raise PodsError(f"cannot read {path}: {os_reason(e)}") from None
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
            raise PodsError(f"{path}:{number}: not a {what} record ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), kind):
            raise PodsError(f"{path}:{number}: not a {what} record (no {field})")
        records.append(record)
    return records


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (or another per-step log), each with its ``step``."""
    return read_jsonl(path, "podsrl log", "step", int)


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop the lines of steps after the checkpoint (they will be redone), and a last
    line cut short."""
    if not path.exists():
        return
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in read_metrics(path) if r["step"] <= step))



def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` whole: written beside it, then renamed. A write that fails (a
    full disk, a file-size limit, a folder that cannot be written) leaves ``path`` as it was and
    raises PodsError naming it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise PodsError(f"cannot write {path}: {os_reason(e)}") from None
