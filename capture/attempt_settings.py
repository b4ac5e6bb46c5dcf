"""What the server, never an HTTP client, decides for the attempts it opens.

An attempt names its selection policy and forest mode in ``POST /v1/attempts``. The policy runs
in the server (the selector), so a client may only name one the server was configured with: the
built-ins, or a custom ``module:function`` registered in the server's configuration
(``token_capture.selection_policy``, ``grove serve --selection-policy``) and resolved when the
server starts. Any other name is refused (400 ``unregistered_selection_policy``) before anything
is written, so no request can make the server import a module. An attempt that names no policy,
or no forest mode, gets the server's own; ``attempt.opened`` records the resolved values
(``docs/gateway.md``, "Attempts").

``DEFAULT_FOREST_MODE`` (off) is written here once: it is the default of Grove's configuration key
``token_capture.forest_training`` too, so a server and a training run that set nothing agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from grove.capture.refusals import Refused
from grove.capture.wire import OpenAttemptRequest

__all__ = ["DEFAULT_FOREST_MODE", "AttemptSettings"]

DEFAULT_FOREST_MODE: Final = False
"""Forest mode of an attempt that gives none, on a server configured with none: off, so rollouts
train as one row each unless forest training is turned on (``docs/forest.md``)."""


@dataclass(frozen=True)
class AttemptSettings:
    """The server's rules for opening attempts (producer: the application's configuration,
    ``grove/services/serve.py``; consumer: ``POST /v1/attempts``).

    ``selection_policies``: the names an attempt may give (the server's selector runs each).
    ``selection_policy``: the policy of an attempt that names none; one of them.
    ``forest_mode``: the forest mode of an attempt that gives none.
    """

    selection_policies: tuple[str, ...] = ("returned_history", "all_captured")
    selection_policy: str = "returned_history"
    forest_mode: bool = DEFAULT_FOREST_MODE

    def __post_init__(self) -> None:
        if self.selection_policy not in self.selection_policies:
            raise ValueError(
                f"the default selection policy {self.selection_policy!r} must be one of the "
                f"server's policies {list(self.selection_policies)}"
            )

    def resolve(self, request: OpenAttemptRequest) -> OpenAttemptRequest:
        """``request`` with the server's defaults where it gives none; ``Refused`` (400) when it
        names a policy this server does not run."""
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
        return request.model_copy(update={"selection_policy": policy, "forest_mode": forest_mode})
