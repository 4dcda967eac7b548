"""Known noise of the libraries podsrl drives, filtered where it starts: each filter names the one
message it drops, so every other warning still shows."""

from __future__ import annotations

import logging
import warnings


def quiet_known_warnings() -> None:
    """Drop deepspeed's "no GPU found" warning (printed on every run of an install that has
    deepspeed, on a machine without a GPU; its choice of accelerator stands) and transformers'
    FutureWarnings on the ``gradient_checkpointing`` names that TRL 1.16 still uses."""
    logging.getLogger("DeepSpeed").addFilter(lambda record: "unable to detect it" not in record.getMessage())
    warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning)
