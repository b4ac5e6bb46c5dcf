"""What the server, never an HTTP client, decides for the attempts it opens.

An attempt names its selection policy and forest mode in ``POST /v1/attempts``. The policy runs
in the server (the selector), so a client may only name one the server was configured with: the
built-ins, or a custom ``module:function`` registered in the server's configuration
(``token_capture.selection_policy``, ``grove serve --selection-policy``) and resolved when the
server starts. Any other name is refused (400 ``unregistered_selection_policy``) before anything
is written, so no request can make the server import a module. An attempt that names no policy,
or no forest mode, gets the server's own; ``attempt.opened`` records the resolved values
(``docs/gateway.md``, "Attempts").

Every policy but ``returned_history`` selects calls that train only as a forest (abandoned
retries, branches, rejected resamples), so it needs forest training. The server's forest mode
(``token_capture.forest_training``, the mode its training run projects with) decides: on a server
with forest mode off, an attempt naming such a policy is refused (400
``selection_policy_needs_forest_training``) before anything is written, and so is one that names
such a policy while giving ``forest_mode: false`` itself, whose record would contradict its
policy. A server whose own default policy needs forest training is not built with forest mode off.
An attempt's recorded ``forest_mode`` decides nothing else: the run's projector trains every
attempt with the run's ``token_capture.forest_training``.

``max_model_calls`` (``token_capture.max_model_calls``; None: unbounded) bounds the model calls
one attempt may record: a call beyond it is refused (409 ``call_budget_exhausted``) before its
intent, nothing written. Every call the attempt recorded counts, whatever became of it (committed,
failed, rejected by the harness, pending): a resample after a rejection is one more call.

``DEFAULT_FOREST_MODE`` (off) is written here once: it is the default of Grove's configuration key
``token_capture.forest_training`` too, so a server and a training run that set nothing agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from grove.capture.refusals import Refused
from grove.capture.wire import OpenAttemptRequest

__all__ = ["DEFAULT_FOREST_MODE", "DEFAULT_SELECTION_POLICY", "AttemptSettings"]

DEFAULT_FOREST_MODE: Final = False
"""Forest mode of an attempt that gives none, on a server configured with none: off, so rollouts
train as one row each unless forest training is turned on (``docs/forest.md``)."""
DEFAULT_SELECTION_POLICY: Final = "returned_history"
"""The one selection policy that does not need forest training."""


@dataclass(frozen=True)
class AttemptSettings:
    """The server's rules for opening attempts (producer: the application's configuration,
    ``grove/services/serve.py``; consumer: ``POST /v1/attempts``).

    ``selection_policies``: the names an attempt may give (the server's selector runs each).
    ``selection_policy``: the policy of an attempt that names none; one of them.
    ``forest_mode``: the forest mode of an attempt that gives none.
    ``max_model_calls``: the model calls one attempt may record (None: unbounded).
    """

    selection_policies: tuple[str, ...] = (DEFAULT_SELECTION_POLICY, "all_captured")
    selection_policy: str = DEFAULT_SELECTION_POLICY
    forest_mode: bool = DEFAULT_FOREST_MODE
    max_model_calls: int | None = None

    def __post_init__(self) -> None:
        if self.selection_policy not in self.selection_policies:
            raise ValueError(
                f"the default selection policy {self.selection_policy!r} must be one of the "
                f"server's policies {list(self.selection_policies)}"
            )
        if self.selection_policy != DEFAULT_SELECTION_POLICY and not self.forest_mode:
            raise ValueError(
                f"the default selection policy {self.selection_policy!r} needs forest training: "
                "turn forest mode on (token_capture.forest_training: true) or make "
                f"{DEFAULT_SELECTION_POLICY} the default"
            )
        if self.max_model_calls is not None and self.max_model_calls < 1:
            raise ValueError(
                f"max_model_calls must be >= 1 (or None: unbounded), got {self.max_model_calls}"
            )

    def resolve(self, request: OpenAttemptRequest) -> OpenAttemptRequest:
        """``request`` with the server's defaults where it gives none; ``Refused`` (400) when it
        names a policy this server does not run, or one that needs forest training without it."""
        policy = request.selection_policy or self.selection_policy
        if policy not in self.selection_policies:
            raise Refused(
                400,
                "unregistered_selection_policy",
                f"Attempt {request.capture_key!r} names selection policy {policy!r}, which this "
                f"server does not run: name one of {', '.join(self.selection_policies)}, or "
                f"none for the server's own ({self.selection_policy}). A custom policy is "
                "registered in the server's configuration (token_capture.selection_policy, or "
                "grove serve --selection-policy), never by a client",
                param="selection_policy",
            )
        forest_mode = self.forest_mode if request.forest_mode is None else request.forest_mode
        if policy != DEFAULT_SELECTION_POLICY and not (self.forest_mode and forest_mode):
            whose = (
                "this server's forest mode is off (token_capture.forest_training: false)"
                if not self.forest_mode
                else "the attempt gives forest_mode: false"
            )
            raise Refused(
                400,
                "selection_policy_needs_forest_training",
                f"Attempt {request.capture_key!r} names selection policy {policy!r}, which "
                f"selects calls that train only as a forest, but {whose}. Name "
                f"{DEFAULT_SELECTION_POLICY} (or none, on a server without forest training), "
                "or run with token_capture.forest_training: true and give no forest_mode",
                param="selection_policy",
            )
        return request.model_copy(update={"selection_policy": policy, "forest_mode": forest_mode})

    def check_budget(self, capture_key: str, recorded_calls: int) -> None:
        """Refuse (409) a new model call of an attempt that recorded ``max_model_calls``."""
        budget = self.max_model_calls
        if budget is not None and recorded_calls >= budget:
            raise Refused(
                409,
                "call_budget_exhausted",
                f"Attempt {capture_key!r} has recorded {recorded_calls} model calls, its budget "
                f"(token_capture.max_model_calls: {budget}); every recorded call counts, a "
                "resample after a rejection too. Post the attempt's result now, or raise "
                "token_capture.max_model_calls",
            )
