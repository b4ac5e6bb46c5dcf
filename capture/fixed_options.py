"""The attempt's fixed configuration: the model and template options every call must share.

An attempt records its model and chat template fingerprints when it opens (``attempt.opened``:
``model_fingerprint``, ``template_fingerprint``, the sha256 of the template text). They stay fixed
during the attempt (``docs/normalization.md``, "Fixed per attempt"), and so do the options that
change how the same messages render and tokenize whatever the call: the template kwargs, the
processor kwargs and the generation-prompt and special-token flags. The first call of the attempt
records those on its intent (``call.intended.admission["fixed_options"]``); every later call
must send the same.

The options a call may change are the ones an agent framework sends per request: ``tools``,
``tool_choice`` and ``reasoning_effort``. A call whose per-call options differ from the call it
continues is a root (``render_options_changed``); a call whose fixed options differ from the
attempt's is refused (:class:`grove.capture.errors.AttemptOptionsChangedError`, 409) before anything
is written, naming the first option that differs.

Pure: plain data in (options, the template text, the attempt's folded state), plain data out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from grove.capture.errors import AttemptOptionsChangedError, RenderError
from grove.capture.render import RenderOptions
from grove.ledger.attempt import AttemptState

__all__ = [
    "FIXED_OPTIONS_KEY",
    "PER_CALL_OPTIONS",
    "check_fixed_options",
    "fixed_options",
]

FIXED_OPTIONS_KEY: Final = "fixed_options"
"""The key of a call's fixed options in its intent's admission record."""
PER_CALL_OPTIONS: Final = ("tools", "tool_choice", "reasoning_effort")
"""The render options a call may change within its attempt."""
_RECORDED: Final = (
    "template_kwargs",
    "processor_kwargs",
    "add_generation_prompt",
    "add_special_tokens",
)


def fixed_options(options: RenderOptions, chat_template: str) -> dict[str, Any]:
    """The options of a call that its attempt fixes, as JSON values (``chat_template`` is the
    effective template text; its sha256 is compared with the attempt's template fingerprint)."""
    record = {
        "model": options.model,
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest(),
        "template_kwargs": dict(options.template_kwargs),
        "processor_kwargs": dict(options.processor_kwargs),
        "add_generation_prompt": options.add_generation_prompt,
        "add_special_tokens": options.add_special_tokens,
    }
    try:  # as the ledger will hold it: tuples become lists, keys strings
        loaded: dict[str, Any] = json.loads(json.dumps(record, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise RenderError(options.model, f"render options must be JSON values: {exc}") from None
    return loaded


def check_fixed_options(fixed: Mapping[str, Any], attempt: AttemptState) -> None:
    """Refuse a call whose fixed options are not its attempt's: the model and template against
    ``attempt.opened``, the rest against the first call's record (when it has one)."""
    for option, got, expected, fixed_by in _attempt_values(fixed, attempt):
        if got != expected:
            raise AttemptOptionsChangedError(attempt.capture_key, option, got, expected, fixed_by)


def _attempt_values(
    fixed: Mapping[str, Any], attempt: AttemptState
) -> list[tuple[str, Any, Any, str]]:
    """(option, the call's value, the attempt's value, what fixed it) for each fixed option the
    attempt has a value for, in the order they are checked."""
    values: list[tuple[str, Any, Any, str]] = []
    opened = attempt.opened
    if opened is not None:
        values += [
            ("model", fixed["model"], opened.model_fingerprint, "attempt.opened model_fingerprint"),
            (
                "chat template (sha256 of its text)",
                fixed["chat_template_sha256"],
                opened.template_fingerprint,
                "attempt.opened template_fingerprint",
            ),
        ]
    first = next(iter(attempt.calls.values()), None)  # None: this call fixes the rest
    recorded = None if first is None else first.intended.admission.get(FIXED_OPTIONS_KEY)
    if first is not None and isinstance(recorded, Mapping):  # older intents lack the record
        by = f"its first call {first.call_id}"
        values += [(name, fixed.get(name), recorded.get(name), by) for name in _RECORDED]
    return values
