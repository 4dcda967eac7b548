"""Known noise of the libraries podsrl drives, filtered where it starts: each filter names the one
message it drops, so every other warning still shows; and a command's logging."""

from __future__ import annotations

import logging
import re
import warnings


def _drop(logger: str, text: str) -> None:
    """Drop the records of ``logger`` whose message holds ``text``."""
    logging.getLogger(logger).addFilter(lambda record: text not in record.getMessage())


def quiet_known_warnings() -> None:
    """Drop deepspeed's "no GPU found" warning (printed on every run of an install that has
    deepspeed, on a machine without a GPU; its choice of accelerator stands) and transformers'
    FutureWarnings on the ``gradient_checkpointing`` names that TRL 1.16 still uses, and
    bitsandbytes' note at import, on a CPU with AVX-512 BF16, that it could not fetch a faster
    4-bit kernel from the Hugging Face hub (offline, or without the ``kernels`` package; its own
    CPU kernel runs instead), and, offline with ``kernels`` installed (transformers 5.25 on
    requires it), that package's note that it skips the kernel's publisher trust check."""
    _drop("DeepSpeed", "unable to detect it")
    _drop("bitsandbytes.backends.cpu.ops", "gemm_4bit_forward from kernels-community")
    trust_note = "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'"
    _drop("kernels._internals.hf_hub", trust_note)
    warnings.filterwarnings("ignore", message=re.escape(trust_note))  # where kernels warns instead of logging
    warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning)


def quiet_logging() -> None:
    """A command's logging: podsrl's INFO lines as bare messages; the libraries' warnings and
    errors only, without transformers' progress bars; and :func:`quiet_known_warnings`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_known_warnings()
    for noisy in ("transformers", "accelerate", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
