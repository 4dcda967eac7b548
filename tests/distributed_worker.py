"""Runs training (one process or under a launcher) and records, after every update, how far the
ranks' parameters are apart, the step's loss and gradient norm, and how many rollouts it replayed
(tests/replay.py). Used by test_distributed.py.

    python distributed_worker.py OUT.json key=value ...
"""

import json
import sys

import torch

import podsrl.trainer as trainer
import replay
from podsrl.config import load_config


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    records = []
    real_update = trainer.update

    def checked_update(s, c, rollouts, chosen, step):
        stats = real_update(s, c, rollouts, chosen, step)
        flat = torch.cat([p.detach().flatten() for p in s.accelerator.unwrap_model(s.model).parameters()])
        every = s.accelerator.gather(flat.unsqueeze(0))  # [world, P]
        records.append({"step": step, "rank_max_abs_diff": float((every - every[0]).abs().max()),
                        "loss": stats["loss"], "grad_norm": stats["grad_norm"], "world": s.accelerator.num_processes})
        return stats

    trainer.update = checked_update
    replay.install(trainer)
    trainer.train(load_config(None, overrides))
    replayed, own = (sum(getattr(e, k, 0) for e in replay.engines) for k in ("replayed", "own"))
    for r in records:
        r.update(replayed=replayed, own=own)  # this rank's rollouts over the run
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
