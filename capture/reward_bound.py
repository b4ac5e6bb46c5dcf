"""The bound on a harness's reward: a result is taken only with a finite reward within it.

A reward is one number per logical rollout that group normalization (``training/advantages.py``)
centres and scales with its siblings'. One huge reward (``1e300``) overflows the group's variance
and silently zeroes every advantage in the group, so the gateway refuses, before anything is
written, a result whose reward is not finite or whose magnitude exceeds the configured bound
(``grpo.max_abs_reward``, default ``DEFAULT_MAX_ABS_REWARD``): 422 ``reward_out_of_range``
(``docs/gateway.md``). The wire model (``HarnessResult``) refuses NaN and infinities first (400);
this check refuses them too, so the bound holds whatever parsed the result.
"""

from __future__ import annotations

import math
from typing import Final

from grove.capture.refusals import Refused

__all__ = ["DEFAULT_MAX_ABS_REWARD", "MAX_REWARD_BOUND", "check_reward", "checked_bound"]

DEFAULT_MAX_ABS_REWARD: Final = 1e6
"""The largest reward magnitude a result may carry unless configured otherwise."""
MAX_REWARD_BOUND: Final = 1e15
"""The largest bound that may be configured: squares of rewards up to it, summed over a group,
stay far inside float32 (about 3.4e38), in which advantages may be computed."""


def checked_bound(bound: float) -> float:
    """``bound`` when it is a usable reward bound (finite, > 0, at most ``MAX_REWARD_BOUND``)."""
    if not (math.isfinite(bound) and 0 < bound <= MAX_REWARD_BOUND):
        raise ValueError(f"max_abs_reward must be in (0, {MAX_REWARD_BOUND:g}], got {bound!r}")
    return bound


def check_reward(capture_key: str, reward: object, bound: float) -> None:
    """Refuse (422 ``reward_out_of_range``) a reward that is not a finite number within
    ``[-bound, bound]``."""
    number = isinstance(reward, int | float) and not isinstance(reward, bool)
    if number and math.isfinite(reward) and abs(reward) <= bound:  # type: ignore[arg-type]
        return
    raise Refused(
        422,
        "reward_out_of_range",
        f"The result of attempt {capture_key!r} has reward {reward!r}: a reward must be a finite "
        f"number with magnitude at most {bound:g} (grpo.max_abs_reward); scale the verifier's "
        "rewards into that range",
        param="reward",
    )
