"""Sharded training under accelerate (FSDP2, DeepSpeed ZeRO), on GPUs and on CPU processes.

accelerate runs processes that have no GPU as ``MULTI_CPU`` and then applies neither FSDP nor
DeepSpeed: its ``AcceleratorState`` turns the launcher's ``ACCELERATE_USE_FSDP`` into FSDP only
for accelerator devices, and reads ``ACCELERATE_USE_DEEPSPEED`` only when ``cpu=False``. A config
asking for either would silently train data-parallel. :func:`make_accelerator` sets the state to
the requested kind itself, with the plugin accelerate builds from the launcher's settings; FSDP2
then shards over a CPU device mesh and gloo, and DeepSpeed uses its CPU accelerator.

A sharded model is whole only inside each layer's forward. Two consequences for the loop:
generation runs on weights gathered once (:func:`whole_for_generation`), so that ranks can decode
different numbers of tokens, or none, without meeting in collectives; and every rank runs as many
forward/backward passes in an update as the rank with the most (:func:`micro_batches_everywhere`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from accelerate import Accelerator, DistributedType

from podsrl.errors import PodsError


def cpu_processes() -> bool:
    """Several processes and fewer GPUs than processes on this machine (torchrun, accelerate
    launch): the processes run on the CPU, over gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world > 1 and torch.cuda.device_count() < local


def make_accelerator(**kwargs) -> Accelerator:
    """``Accelerator(**kwargs)``, on the CPU when :func:`cpu_processes`, and sharded there as the
    launcher asked (FSDP2 or DeepSpeed), which accelerate alone would not do."""
    cpu = cpu_processes()
    if _flag("ACCELERATE_USE_FSDP"):  # before accelerate builds an FSDP1 plugin (which fails without a GPU)
        check_fsdp_version(int(os.environ.get("FSDP_VERSION", "1")))
    acc = Accelerator(cpu=cpu, **kwargs)
    if cpu and acc.distributed_type == DistributedType.MULTI_CPU:
        if _flag("ACCELERATE_USE_FSDP"):
            _shard_with_fsdp(acc)
        elif _flag("ACCELERATE_USE_DEEPSPEED"):
            _shard_with_deepspeed(acc)
    if acc.distributed_type == DistributedType.FSDP:
        check_fsdp_version(acc.state.fsdp_plugin.fsdp_version)
    if is_deepspeed(acc) and acc.state.deepspeed_plugin.zero_stage == 3:
        raise PodsError("DeepSpeed ZeRO-3 is not supported: it partitions the parameters that generation reads "
                        "whole; use FSDP (configs/accelerate/fsdp.yaml), which shards them too, or ZeRO-2")
    return acc


def check_fsdp_version(version: int) -> None:
    """Refuse FSDP1, on any device: it all-gathers each layer inside its forward, so ranks that
    decode different numbers of tokens would meet in different collectives (a hang), and its
    state dict is whole on rank 0 only, which the vLLM engine's push cannot use."""
    if version != 2:
        raise PodsError(f"FSDP needs fsdp_version: 2 in the accelerate config (got {version}); "
                        "FSDP1 is not supported")


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


def _set_kind(acc: Accelerator, kind: DistributedType) -> None:
    from accelerate.state import PartialState

    acc.state.distributed_type = kind
    PartialState._shared_state["distributed_type"] = kind  # what PartialState() reports elsewhere


def _shard_with_fsdp(acc: Accelerator) -> None:
    from accelerate import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
    if acc.mixed_precision != "no":
        plugin.set_mixed_precision(acc.mixed_precision)
    acc.state.fsdp_plugin = plugin
    _set_kind(acc, DistributedType.FSDP)


def _shard_with_deepspeed(acc: Accelerator) -> None:
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin()  # from the launcher's ACCELERATE_DEEPSPEED_* variables
    plugin.set_mixed_precision(acc.mixed_precision)
    plugin.select(_from_accelerator_state=True)
    acc.state.deepspeed_plugins = plugin
    acc.state._mixed_precision = "no"  # DeepSpeed casts itself, from its own config
    _set_kind(acc, DistributedType.DEEPSPEED)


def is_sharded(acc: Accelerator) -> bool:
    return acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def params_whole(acc: Accelerator) -> bool:
    """Whether each process holds every parameter whole outside a forward: not under FSDP (ZeRO-2
    partitions gradients and optimizer state only; ZeRO-3 is refused)."""
    return acc.distributed_type != DistributedType.FSDP


def is_deepspeed(acc: Accelerator) -> bool:
    return acc.distributed_type == DistributedType.DEEPSPEED


def prepare(acc: Accelerator, model, optimizer, micro_batch: int, max_grad_norm: float):
    """``acc.prepare(model, optimizer)``. Under DeepSpeed, its config takes podsrl's batch and
    clipping: one optimizer step per call of :func:`backward` with ``last=True``, gradients
    clipped by DeepSpeed to ``max_grad_norm`` (0: not clipped)."""
    if is_deepspeed(acc):
        config = acc.state.deepspeed_plugin.deepspeed_config
        config.update(train_micro_batch_size_per_gpu=micro_batch, gradient_accumulation_steps=1,
                      gradient_clipping=max_grad_norm)
    return acc.prepare(model, optimizer)


def backward(acc: Accelerator, model, loss: torch.Tensor, last: bool) -> None:
    """``acc.backward(loss)``. accelerate steps DeepSpeed's optimizer in every backward; the
    micro-batches before the ``last`` one only accumulate their gradients."""
    if is_deepspeed(acc) and not last:
        model.set_gradient_accumulation_boundary(False)
        model.backward(loss)
    else:
        acc.backward(loss)


@contextmanager
def whole_for_generation(model: torch.nn.Module):
    """Under FSDP2, every sharded module of ``model`` all-gathered once on entry (the same
    collectives, in the same order, on every rank) and kept whole until exit; elsewhere nothing.
    Inside, forwards run no collectives, so each rank may take its own number of decoding steps.
    Costs the full weights on each rank for the duration."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    resharding = [_reshards_after_forward(m) for m in units]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m, reshard in zip(units, resharding):
            m.reshard()
            m.set_reshard_after_forward(reshard, recurse=False)


def _reshards_after_forward(module) -> bool:
    """Whether an FSDP2 module frees its gathered weights after each forward. torch has no public
    getter: its FSDP state holds one parameter group (``_fsdp_param_group``, torch 2.6 to the
    releases before multiple groups) or a list of them (``_fsdp_param_groups``, torch 2.13)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = state._fsdp_param_group
        groups = [group] if group is not None else []
    return any(g.post_forward_mesh_info is not None for g in groups)


def micro_batches_everywhere(acc: Accelerator, count: int) -> int:
    """The largest micro-batch count of any rank: under FSDP or DeepSpeed each forward and
    backward is a collective, so every rank must run as many (extra ones with zero weight)."""
    if acc.num_processes == 1 or not is_sharded(acc):
        return count
    return int(acc.gather(torch.tensor([count], device=acc.device)).max())
