"""podsrl: reinforcement learning with verifiable rewards for language models, with PODS."""

from podsrl.advantages import group_advantages
from podsrl.downsample import RULES, register_rule, select
from podsrl.loss import policy_loss

__all__ = ["RULES", "group_advantages", "policy_loss", "register_rule", "select"]
__version__ = "0.1.0"
