"""Whether the Hugging Face hub answers: asked once per process, with a short timeout, so that a
name neither on disk nor in the cache fails at once instead of after a minute of retries."""

from __future__ import annotations

import functools

TIMEOUT_S = 5.0


@functools.cache
def reachable() -> bool:
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=TIMEOUT_S)
    except Exception:  # noqa: BLE001 (offline mode, DNS, refused, timeout: all mean "not now")
        return False
    return True
