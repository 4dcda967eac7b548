"""Group-normalised advantages over the *selected* rollouts of each prompt.

GRPO (Shao et al., 2024) scores rollout i of a group by

    A_i = (r_i − mean(r)) / (std(r) + eps),

and PODS (Xu et al., 2025, Sec. 3) computes mean and std over the m selected rollouts only, not
over all n generated. Dr. GRPO (Liu et al., 2025) drops the division by std. As in TRL, std is the
sample (unbiased) standard deviation. A group whose selected rewards are all equal carries no
learning signal and gets zero advantages, never NaN or inf.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Scale = Literal["group", "none"]


def group_advantages(rewards: Tensor, scale: Scale = "group", eps: float = 1e-4) -> Tensor:
    """Advantages of the selected rewards.

    Args:
        rewards: ``[B, m]`` rewards of the rollouts each group trains on (or ``[m]``).
        scale: ``"group"`` divides by the group's std (GRPO); ``"none"`` only centres (Dr. GRPO).
        eps: added to the std before dividing.

    Returns:
        advantages, same shape as ``rewards``, and its dtype where that is a float one (integer or
        bool rewards give float32 advantages); empty where it is (no groups, or groups of none).

    Raises:
        ValueError: on an unknown ``scale``, or rewards that are NaN or infinite (as ``select``).
    """
    if scale not in ("group", "none"):
        raise ValueError(f"scale must be 'group' or 'none', got {scale!r}")
    rewards = torch.as_tensor(rewards)
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.unsqueeze(0) if rewards.dim() == 1 else rewards  # [B, m]
    constant = (r.amax(-1, keepdim=True) == r.amin(-1, keepdim=True))  # [B, 1]
    centred = r - r.mean(-1, keepdim=True)  # [B, m]
    if scale == "group" and r.shape[-1] > 1:
        centred = centred / (r.std(-1, keepdim=True) + eps)
    adv = torch.where(constant, torch.zeros_like(centred), centred)
    return adv.squeeze(0) if rewards.dim() == 1 else adv
