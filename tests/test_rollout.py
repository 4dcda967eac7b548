"""HF rollout engine: EOS masking, seeded rows, shapes.

Tests that compare rollouts drawn in batches of different shapes (a prompt alone or with others,
rows dropped as they end, padded prompts) run the tiny model in float64: a sampled token flips
where two batches' logits differ across a CDF boundary, and float32 kernels that block a matrix
product by batch size round differently on some CPUs (enough, on a near-uniform random model, to
flip tokens). In float64 two batches' logits differ by about 1e-16, so once cast to float32 for
sampling they are the same numbers but in about one logit in 1e9."""

import pytest
import torch

from podsrl import models
from podsrl.rollout import hf
from podsrl.rollout.hf import (HFEngine, choose_decoder, mask_after_eos, row_seed_tensor, row_uniforms, sample_rows,
                               shared_prefix_length)


def exact_model(folder):
    """The tiny model in float64: see the module's docstring."""
    return models.load_model(folder).double()


def test_mask_after_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 2, 2, 2, 2]])
    out, mask = mask_after_eos(ids, [2], pad_id=0)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert out.tolist() == [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]


def test_row_draws_depend_only_on_seed_and_position_and_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    seeds = row_seed_tensor([1, 2, 3, 2**70 + 5])
    a = sample_rows(logits.repeat(4, 1), seeds, 5, temperature=1.0)
    b = sample_rows(logits.repeat(2, 1), seeds[[3, 1]], 5, temperature=1.0)
    assert a[3] == b[0] and a[1] == b[1]  # a row's draw does not depend on its batch
    u = row_uniforms(torch.arange(5000), 3)
    assert torch.equal(u, row_uniforms(torch.arange(5000), 3)) and not torch.equal(u, row_uniforms(torch.arange(5000), 4))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    # over seeds and over positions, the tokens follow the distribution
    by_seed = sample_rows(logits.repeat(6000, 1), row_seed_tensor(range(6000)), 0, temperature=1.0)
    by_position = torch.stack([sample_rows(logits, row_seed_tensor([7]), t, 1.0) for t in range(3000)]).flatten()
    for draws in (by_seed, by_position):
        freq = torch.bincount(draws, minlength=3).float() / len(draws)
        assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    nucleus = sample_rows(logits.repeat(500, 1), row_seed_tensor(range(500)), 0, temperature=1.0, top_p=0.75)
    assert set(nucleus.tolist()) == {0, 1}  # top-p 0.75 keeps 0.7 + 0.2
    hot = sample_rows(logits.repeat(6000, 1), row_seed_tensor(range(6000)), 0, temperature=2.0)
    freq = torch.bincount(hot, minlength=3).float() / 6000
    expected = torch.softmax(logits[0] / 2.0, -1)
    assert torch.allclose(freq, expected, atol=0.03)


def test_engine_shapes_and_seeded_groups(tiny_model_dir):
    tok = models.load_tokenizer(tiny_model_dir)
    engine = HFEngine(exact_model(tiny_model_dir), tok, batch_size=5)
    prompts = ["1 + 1 =", "a longer prompt than the first one"]
    out = engine.generate(prompts, 3, 1.0, 5, seeds=[7, 8])
    assert out.completion_ids.shape[0] == 6 and out.prompt_ids.shape[0] == 6 and len(out.texts) == 6
    assert (out.prompt_mask[:3, 0] == 0).all()  # the short prompt is left-padded
    alone = engine.generate(prompts[1:], 3, 1.0, 5, seeds=[8])
    assert torch.equal(alone.completion_ids, out.completion_ids[3:, : alone.completion_ids.shape[1]])


def test_shared_prompt_cache_gives_the_same_rollouts(tiny_model_dir):
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    shared = HFEngine(model, tok, batch_size=8, share_prompt_cache=True).generate(prompts, 4, 1.0, 6, seeds=[1, 2, 3])
    plain = HFEngine(model, tok, batch_size=8, share_prompt_cache=False).generate(prompts, 4, 1.0, 6, seeds=[1, 2, 3])
    assert torch.equal(shared.completion_ids, plain.completion_ids) and shared.texts == plain.texts


@pytest.mark.parametrize("share", [True, False])
def test_loop_decoder_matches_generate(tiny_model_dir, share):
    """Dropping finished rows changes no token: the same rollouts as transformers' generate."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    kw = dict(batch_size=8, share_prompt_cache=share)
    loop = HFEngine(model, tok, decoder="loop", **kw).generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    gen = HFEngine(model, tok, decoder="generate", **kw).generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    assert torch.equal(loop.completion_ids, gen.completion_ids) and loop.texts == gen.texts
    assert torch.equal(loop.completion_mask, gen.completion_mask)
    greedy = [HFEngine(model, tok, decoder=d, **kw).generate(prompts, 1, 0.0, 8) for d in ("loop", "generate")]
    assert torch.equal(greedy[0].completion_ids, greedy[1].completion_ids)


def test_shared_prefix_length_of_left_padded_prompts():
    # rows right-aligned; 0 is padding. Worked by hand: every row starts 7 8, the third row's
    # third token differs; the shortest row (4 tokens) may share at most 3
    ids = torch.tensor([[0, 0, 7, 8, 9, 5], [7, 8, 9, 4, 4, 4], [0, 0, 7, 8, 3, 5]])
    mask = (torch.arange(6) >= torch.tensor([[2], [0], [2]])).long()
    assert shared_prefix_length(ids, mask) == 2
    assert shared_prefix_length(ids[:2], mask[:2]) == 3  # 7 8 9, and the short row keeps its last token
    same = torch.tensor([[7, 8, 9], [7, 8, 9]])
    assert shared_prefix_length(same, torch.ones_like(same)) == 2  # never the last token
    assert shared_prefix_length(torch.tensor([[0, 7], [7, 7]]), torch.tensor([[0, 1], [1, 1]])) == 0


CHAT_LIKE = ["<s>system: answer with a number. user: 1 + 1 = assistant:",
             "<s>system: answer with a number. user: what is 12 - 5 then? assistant:",
             "<s>system: answer with a number. user: 3 = assistant:"]


@pytest.mark.parametrize("n,temperature", [(1, 0.0), (3, 1.0)])
def test_a_shared_prefix_is_prefilled_once_and_changes_no_token(tiny_model_dir, n, temperature):
    """Prompts that start alike (a chat template, a system prompt): the common start is one row of
    the first forward, the rest of each prompt the second, no prefill forward computes logits past
    the last position, and the rollouts are those of transformers' generate on the whole prompts."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    common = shared_prefix_length(*tok(CHAT_LIKE, return_tensors="pt", padding=True, add_special_tokens=False).values())
    assert common >= 8
    forwards, head_rows = [], []
    model.register_forward_pre_hook(lambda m, a, k: forwards.append(tuple(k["input_ids"].shape)), with_kwargs=True)
    model.lm_head.register_forward_pre_hook(lambda m, a: head_rows.append(a[0].shape[1]))
    seeds = [4, 5, 6]
    loop = HFEngine(model, tok, batch_size=16, decoder="loop").generate(CHAT_LIKE, n, temperature, 8, seeds=seeds)
    assert forwards[0] == (1, common)  # the prefix, once
    assert forwards[1][0] == 3 and forwards[1][1] < max(len(tok(p).input_ids) for p in CHAT_LIKE) - common
    assert all(r == 1 for r in head_rows)  # one position's logits per forward
    gen = HFEngine(model, tok, batch_size=16, decoder="generate").generate(CHAT_LIKE, n, temperature, 8, seeds=seeds)
    assert torch.equal(loop.completion_ids, gen.completion_ids) and loop.texts == gen.texts
    alone = [HFEngine(model, tok, decoder="loop").generate([p], n, temperature, 8, seeds=[s]) for p, s in zip(CHAT_LIKE, seeds)]
    for i, one in enumerate(alone):
        width = one.completion_ids.shape[1]
        assert torch.equal(one.completion_ids, loop.completion_ids[i * n : (i + 1) * n, :width])


def test_loop_decoder_stops_rows_at_their_end(tiny_model_dir):
    """A row that has ended gets no more tokens, and later steps run (nearly) only the rows still going."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = models.load_model(tiny_model_dir)
    engine = HFEngine(model, tok, batch_size=64)
    eos = engine.eos_ids[0]
    def likely_eos(module, args, logits):  # about one row in three ends at each step
        logits[..., eos] += 10.0
        return logits

    model.lm_head.register_forward_hook(likely_eos)
    batch_sizes = []
    model.register_forward_pre_hook(lambda m, args, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    out = engine.generate(["1 + 1 =", "x"], 16, 1.0, 10, seeds=[1, 2])
    lengths = out.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows did end at different steps
    decode_steps = batch_sizes[1:]  # after the prompts' prefill
    assert decode_steps[0] == 32 and decode_steps == sorted(decode_steps, reverse=True) and decode_steps[-1] < 32
    # rows that have ended leave once they are a quarter of the batch: a step's batch is less than
    # 4/3 of its running rows, whose tokens add up to the completions' lengths
    assert 3 * sum(decode_steps) < 4 * int(lengths.sum()) < 4 * 32 * len(decode_steps)


@pytest.mark.parametrize("decoder", ["loop", "generate", "static"])
def test_decoders_pass_the_kv_cache_under_the_name_transformers_uses(tiny_model_dir, decoder):
    """transformers renamed the cache argument; the old name warns on every forward call."""
    import warnings

    tok = models.load_tokenizer(tiny_model_dir)
    engine = HFEngine(models.load_model(tiny_model_dir), tok, batch_size=8, decoder=decoder)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        out = engine.generate(["1 + 1 =", "a longer prompt than the first one"], 3, 1.0, 5, seeds=[1, 2])
    assert out.completion_ids.shape[0] == 6


def test_static_cache_decoder_matches_loop(tiny_model_dir):
    """generate with a static KV cache (compiled on a GPU) and padded prompts: the same rollouts."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    loop = HFEngine(model, tok, batch_size=8).generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    static = HFEngine(model, tok, batch_size=8, decoder="static").generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    assert static.prompt_ids.shape[1] % 16 == 0 and static.prompt_ids.shape[1] > loop.prompt_ids.shape[1]
    assert torch.equal(static.completion_ids, loop.completion_ids) and static.texts == loop.texts
    assert torch.equal(static.completion_mask, loop.completion_mask)
    greedy = [HFEngine(model, tok, decoder=d).generate(prompts, 1, 0.0, 8) for d in ("loop", "static")]
    assert torch.equal(greedy[0].completion_ids, greedy[1].completion_ids)


def test_auto_decoder_choice_by_device_and_rows_per_call():
    """static only on a CUDA GPU and only up to the crossover; loop everywhere else."""
    crossover = hf.STATIC_MAX_ROWS
    assert 256 <= crossover < 1024  # between the sizes where static won (256) and lost (1,024) on an H100
    for rows in (1, 64, 256, crossover):
        assert choose_decoder("cuda", rows) == "static"
        assert choose_decoder("cpu", rows) == "loop"
    for rows in (crossover + 1, 1024, 4096):
        assert choose_decoder("cuda", rows) == "loop" and choose_decoder("cpu", rows) == "loop"
    assert choose_decoder("cuda", 300, static_max_rows=256) == "loop"
    assert choose_decoder("mps", 8) == "loop"
    with pytest.raises(ValueError, match="rows"):
        choose_decoder("cuda", 0)
    with pytest.raises(ValueError, match="unknown decoder"):
        HFEngine(torch.nn.Linear(1, 1), None, decoder="fast")


def test_auto_decoder_on_a_cpu_gives_the_loop_decoders_rollouts(tiny_model_dir):
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    auto = HFEngine(model, tok, batch_size=8).generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    loop = HFEngine(model, tok, batch_size=8, decoder="loop").generate(prompts, 4, 1.0, 8, seeds=[1, 2, 3])
    assert torch.equal(auto.prompt_ids, loop.prompt_ids) and torch.equal(auto.completion_ids, loop.completion_ids)
    assert torch.equal(auto.completion_mask, loop.completion_mask) and auto.texts == loop.texts


def test_auto_decoder_asks_with_the_rows_of_one_call(tiny_model_dir, monkeypatch):
    """auto decides once per generate() from the rows of its largest call (prompts per call x n),
    and runs what it chose: here static, whose prompts are padded to a multiple of 16."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = models.load_model(tiny_model_dir)
    asked = []
    monkeypatch.setattr(hf, "choose_decoder", lambda device, rows, **_: asked.append((device, rows)) or "static")
    prompts = ["1 + 1 =", "a longer prompt than the first one", "x"]
    out = HFEngine(model, tok, batch_size=8).generate(prompts, 4, 1.0, 4, seeds=[1, 2, 3])  # 2 prompts per call
    one = HFEngine(model, tok, batch_size=64).generate(prompts[:1], 4, 1.0, 4, seeds=[1])  # fewer prompts than a call holds
    assert asked == [("cpu", 8), ("cpu", 4)]
    assert out.prompt_ids.shape[1] % 16 == 0 and one.prompt_ids.shape[1] % 16 == 0


def autocast_forward(model):
    """The model with its forward under bf16 autocast, as accelerate's mixed precision wraps it."""
    forward = model.forward

    def wrapped(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = wrapped
    return model


def test_the_static_cache_probe_foretells_static_generation_under_autocast(tiny_model_dir):
    """Under bf16 autocast the keys leave the rotary embedding in float32 and the values leave
    their projection in bf16. The probe says whether transformers' static cache holds both; it
    must agree with what generating with that cache under autocast does here."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = autocast_forward(models.load_model(tiny_model_dir))
    ids = tok(["1 + 1 ="], return_tensors="pt")["input_ids"]
    try:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                       pad_token_id=tok.pad_token_id, cache_implementation="static")
        generated = True
    except RuntimeError as e:
        assert "dtype" in str(e), e
        generated = False
    assert hf.static_cache_keeps_value_dtype.__wrapped__() == generated
    engine = HFEngine(model, tok, decoder="auto", autocast=True)
    assert engine.static_ok == generated
    if generated:  # the static decoder runs under autocast through the engine too
        out = HFEngine(model, tok, decoder="static", autocast=True).generate(["1 + 1 =", "x"], 2, 1.0, 4, seeds=[1, 2])
        assert out.completion_ids.shape[0] == 4 and len(out.texts) == 4


class KeysDtypeLayer:
    """transformers' static layer before 5.24: both tensors in the keys' dtype."""

    def __init__(self, max_cache_len: int, **kwargs):
        self.max_cache_len = max_cache_len

    def lazy_initialization(self, key_states, value_states):
        self.keys = torch.zeros(*key_states.shape[:2], self.max_cache_len, key_states.shape[-1], dtype=key_states.dtype)
        self.values = torch.zeros(*value_states.shape[:2], self.max_cache_len, value_states.shape[-1], dtype=key_states.dtype)


class OwnDtypeLayer(KeysDtypeLayer):
    """From 5.24: the values in their own dtype."""

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self.values = self.values.to(value_states.dtype)


def test_a_static_cache_of_one_dtype_sends_auto_to_the_loop_and_refuses_static_under_autocast(monkeypatch):
    import transformers.cache_utils

    from podsrl.errors import PodsError

    probe = hf.static_cache_keeps_value_dtype.__wrapped__
    monkeypatch.setattr(transformers.cache_utils, "StaticLayer", OwnDtypeLayer)
    assert probe() is True
    monkeypatch.setattr(transformers.cache_utils, "StaticLayer", KeysDtypeLayer)
    assert probe() is False
    monkeypatch.delattr(transformers.cache_utils, "StaticLayer")
    assert probe() is False  # no such layer: not to be relied on

    monkeypatch.setattr(hf, "static_cache_keeps_value_dtype", lambda: False)
    assert choose_decoder("cuda", 64, static_ok=False) == "loop" and choose_decoder("cuda", 64) == "static"
    assert hf.static_allowed("auto", autocast=True) is False
    assert hf.static_allowed("static", autocast=False) is True  # without autocast keys and values share a dtype
    with pytest.raises(PodsError, match=r"rollout.decoder=static under mixed precision needs transformers >= 5.24 .*rollout.decoder=loop"):
        HFEngine(torch.nn.Linear(1, 1), None, decoder="static", autocast=True)


def test_a_run_that_cannot_decode_static_at_its_precision_is_refused_before_its_folder(tmp_path, monkeypatch):
    """The engine check asks the accelerator's precision, before the task, the model or the run's folder."""
    from types import SimpleNamespace

    from podsrl.config import load_config
    from podsrl.errors import PodsError
    from podsrl.trainer import setup

    monkeypatch.setattr(hf, "static_cache_keeps_value_dtype", lambda: False)
    out = tmp_path / "run"
    c = load_config(None, ["rollout.decoder=static", f"output_dir={out}"])
    with pytest.raises(PodsError, match="rollout.decoder=static under mixed precision"):
        setup(c, SimpleNamespace(num_processes=1, mixed_precision="bf16"))
    assert not out.exists()
    with pytest.raises(PodsError, match="data file not found"):  # at fp32 the check passes and setup goes on to the task
        setup(load_config(None, ["rollout.decoder=static", f"output_dir={out}", "task.name=gsm8k",
                                 f"task.path={tmp_path / 'absent.jsonl'}"]), SimpleNamespace(num_processes=1, mixed_precision="no"))


def test_call_width_is_the_calls_own_longest_prompt():
    """hf.call_width, hand-worked: left-padded masks of width 7 whose longest row has 3 tokens."""
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    assert hf.call_width(mask, 1, "left") == 3
    assert hf.call_width(mask, 2, "left") == 4  # rounded up to the static cache's multiple
    assert hf.call_width(mask, 16, "left") == 7  # never past the whole width
    assert hf.call_width(mask, 1, "right") == 7  # right padding: the whole width


@pytest.mark.parametrize("decoder", ["loop", "generate", "static"])
def test_each_call_pads_its_prompts_to_its_own_longest_only(tiny_model_dir, decoder):
    """Three prompts, two a call (of two rollouts each): the first call's prompts are padded to the longer of its own two,
    not to the third's length; the completions are those of each prompt generated alone, and the
    returned prompts are padded to the longest of all."""
    tok = models.load_tokenizer(tiny_model_dir)
    model = exact_model(tiny_model_dir)
    prompts = ["x", "1 + 1 =", "a prompt far longer than the two before it, so that it needs more than sixteen tokens"]
    lengths = [len(tok(p, add_special_tokens=False).input_ids) for p in prompts]
    assert lengths[2] > 16 > lengths[1] > lengths[0]
    engine = HFEngine(model, tok, batch_size=4, decoder=decoder)  # 2 prompts x 2 rollouts a call
    widths = []
    for name in ("_prompt_cache", "_generate"):  # every call passes its prompts through one of them
        original = getattr(engine, name)
        setattr(engine, name, lambda ids, *a, _original=original, **k: widths.append(ids.shape[1]) or _original(ids, *a, **k))
    out = engine.generate(prompts, 2, 1.0, 5, seeds=[1, 2, 3])
    first = widths[0]
    assert first == (16 if decoder == "static" else lengths[1])
    assert max(widths) >= (32 if decoder == "static" else lengths[2]) and out.prompt_ids.shape[1] == max(widths)
    for i, prompt in enumerate(prompts):
        alone = HFEngine(model, tok, batch_size=2, decoder=decoder).generate([prompt], 2, 1.0, 5, seeds=[i + 1])
        rows = out.completion_ids[2 * i : 2 * i + 2]
        assert out.texts[2 * i : 2 * i + 2] == alone.texts
        assert torch.equal(rows[:, : alone.completion_ids.shape[1]], alone.completion_ids)


def test_eval_padding_counts_by_hand():
    """benchmarks/eval_padding.py's count, hand-worked: lengths 1, 5, 2, 9 two a call are 4 x 9 = 36
    tokens padded to the longest of all; sorted, (1, 2) and (5, 9) are 2 x 2 + 2 x 9 = 22."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("eval_padding", Path(__file__).parents[1] / "benchmarks" / "eval_padding.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.padded([1, 5, 2, 9], 2) == (36, 22)
    assert module.padded([3, 3, 3], 128) == (9, 9)
