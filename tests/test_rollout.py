"""HF rollout engine: EOS masking, seeded rows, shapes."""

import torch

from podsrl import models
from podsrl.rollout.hf import HFEngine, RowSampler, mask_after_eos


def test_mask_after_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 2, 2, 2, 2]])
    out, mask = mask_after_eos(ids, [2], pad_id=0)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert out.tolist() == [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]


def test_row_sampler_depends_only_on_its_seed_and_follows_the_distribution():
    scores = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(3, 1)
    a = RowSampler([1, 2, 3], temperature=1.0, top_p=1.0)
    b = RowSampler([9, 2], temperature=1.0, top_p=1.0)
    pick = lambda s, sc: s(None, sc).argmax(-1)
    assert pick(a, scores)[1] == pick(b, scores[:2])[1]  # row with seed 2 agrees
    draws = torch.stack([pick(RowSampler([s], 1.0, 1.0), scores[:1])[0] for s in range(3000)])
    freq = torch.bincount(draws, minlength=3).float() / 3000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    nucleus = torch.stack([pick(RowSampler([s], 1.0, 0.75), scores[:1])[0] for s in range(500)])
    assert set(nucleus.tolist()) <= {0, 1}  # top-p 0.75 keeps 0.7 + 0.2


def test_engine_shapes_and_seeded_groups(tiny_model_dir):
    tok = models.load_tokenizer(tiny_model_dir)
    engine = HFEngine(models.load_model(tiny_model_dir), tok, batch_size=5)
    prompts = ["1 + 1 =", "a longer prompt than the first one"]
    out = engine.generate(prompts, 3, 1.0, 5, seeds=[7, 8])
    assert out.completion_ids.shape[0] == 6 and out.prompt_ids.shape[0] == 6 and len(out.texts) == 6
    assert (out.prompt_mask[:3, 0] == 0).all()  # the short prompt is left-padded
    alone = engine.generate(prompts[1:], 3, 1.0, 5, seeds=[8])
    assert torch.equal(alone.completion_ids, out.completion_ids[3:, : alone.completion_ids.shape[1]])


def test_shared_prompt_cache_gives_the_same_rollouts(tiny_model_dir):
    tok = models.load_tokenizer(tiny_model_dir)
    model = models.load_model(tiny_model_dir)
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    shared = HFEngine(model, tok, batch_size=8, share_prompt_cache=True).generate(prompts, 4, 1.0, 6, seeds=[1, 2, 3])
    plain = HFEngine(model, tok, batch_size=8, share_prompt_cache=False).generate(prompts, 4, 1.0, 6, seeds=[1, 2, 3])
    assert torch.equal(shared.completion_ids, plain.completion_ids) and shared.texts == plain.texts
