"""Runs PODSTrainer (one process or under a launcher) and writes, per rank, the completions its
reward function scored, the inputs its loss received and its final parameters. Used by
test_trl_integration.py.

    python trl_distributed_worker.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from podsrl.integrations.trl import PODSConfig, PODSTrainer
from rewards_for_tests import varied


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    scored, losses = [], []

    def reward(prompts, completions, completion_ids, **_):
        values = varied(completions, completion_ids)
        scored.append([[p, list(ids), r] for p, ids, r in zip(prompts, completion_ids, values)])
        return values

    args = PODSConfig(output_dir=out, use_cpu=True, report_to="none", bf16=False, max_completion_length=6,
                      learning_rate=1e-2, max_steps=2, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
                      num_generations=4, pods_m=2, per_device_train_batch_size=4, scale_rewards="batch",
                      beta=0.1)  # each process computes the reference log-probabilities of its kept rows
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    prompts = [f"{a} + {b} =" for a in range(4) for b in range(4)]
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)
    inner = trainer._compute_loss

    def spy(model, inputs):
        ids = [row[mask.bool()].tolist() for row, mask in zip(inputs["completion_ids"], inputs["completion_mask"])]
        losses.append({"completion_ids": ids, "advantages": inputs["advantages"].tolist()})
        return inner(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"world": trainer.accelerator.num_processes, "scored": scored, "losses": losses,
                   "params": params[:: max(1, params.numel() // 5000)].tolist()}, f)


if __name__ == "__main__":
    main()
