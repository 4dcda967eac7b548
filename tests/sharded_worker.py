"""Runs training (under a launcher) and writes what each rank saw: how its parameters are held
(sharded or whole), which log-prob path the update took, and each step's loss, gradient norm and
micro-batch count, and how many rollouts it replayed (tests/replay.py), how many times FSDP2's
modules were unsharded outside a forward, and, with ``PODSRL_FAKE_VLLM=1`` (the vLLM engine around
tests/fake_vllm.py's stand-in), the engine's calls and a checksum of each push. Used by
test_sharded.py.

    python sharded_worker.py OUT_DIR key=value ...      (writes OUT_DIR/rank<R>.json)
"""

import json
import os
import sys
from pathlib import Path

import pytest

import fake_vllm
import podsrl.trainer as trainer
import replay
from podsrl.config import load_config


def main() -> None:
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    record = {"steps": [], "logprob_heads": set()}
    real_setup, real_update, real_logprobs = trainer.setup, trainer.update, trainer.completion_logprobs

    def setup(c, accelerator=None):
        from torch.distributed.tensor import DTensor

        s = real_setup(c, accelerator)
        params = [p for p in s.accelerator.unwrap_model(s.model).parameters()]
        record.update(
            world=s.accelerator.num_processes, distributed_type=str(s.accelerator.distributed_type),
            dtensor_params=sum(isinstance(p, DTensor) for p in params), params=len(params),
            local_numel=sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params),
            full_numel=sum(p.numel() for p in params),
        )
        zero = getattr(s.model, "optimizer", None)  # DeepSpeed's ZeRO optimizer: this rank's partition
        if hasattr(zero, "single_partition_of_fp32_groups"):
            record["optimizer_numel"] = sum(p.numel() for p in zero.single_partition_of_fp32_groups)
        return s

    def update(s, c, rollouts, chosen, step):
        stats = real_update(s, c, rollouts, chosen, step)
        record["steps"].append({"step": step, **{k: stats[k] for k in ("loss", "grad_norm", "micro_batches")}})
        return stats

    def completion_logprobs(model, *args, **kwargs):
        head = args[4] if len(args) > 4 else kwargs.get("head")
        record["logprob_heads"].add("lean" if head is not None else "full")
        return real_logprobs(model, *args, **kwargs)

    trainer.setup, trainer.update, trainer.completion_logprobs = setup, update, completion_logprobs
    replay.install(trainer)
    record["unshards"] = 0
    from torch.distributed.fsdp import FSDPModule

    real_unshard = FSDPModule.unshard

    def unshard(self, *args, **kwargs):
        record["unshards"] += 1
        return real_unshard(self, *args, **kwargs)

    FSDPModule.unshard = unshard
    log, fakes = [], []
    if os.environ.get("PODSRL_FAKE_VLLM"):
        fakes = fake_vllm.install(pytest.MonkeyPatch(), trainer, log)
        recorded_update = trainer.update

        def logged_update(*args, **kwargs):
            log.append("update")
            return recorded_update(*args, **kwargs)

        trainer.update = logged_update
    trainer.train(load_config(None, overrides))
    if fakes:
        record["calls"] = log
        record["pushed"] = fakes[0].pushed
        record["push_sums"] = fakes[0].sums
    record.update({k: sum(getattr(e, k, 0) for e in replay.engines) for k in ("replayed", "own")})
    record["logprob_heads"] = sorted(record["logprob_heads"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
