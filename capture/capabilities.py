"""Attempt capabilities: the secret that opening an attempt returns, and the check of every later
request on it (``docs/security.md``, "Who holds which secret").

Opening an attempt (``POST /v1/attempts``) answers with its attempt token, once: 32 random bytes,
URL-safe base64 (``secrets.token_urlsafe``). A client may instead propose its own token in the
``X-Grove-Attempt-Token`` header of the opening (``grove.client`` does, so that it can retry an
opening whose answer was lost); a proposal must be 32-128 characters of ``A-Z a-z 0-9 _ -``. The
ledger records only a digest of the token, bound to the capture key (sha256 over a domain tag, the
key and the token, ``attempt_token_digest``), in the ``attempt.opened`` event, so every gateway
process can check a token with no state of its own and the ledger never holds the secret.

Every later request on the attempt (its model calls, reject, close, result, measure and the
attempt read) carries the token in ``X-Grove-Attempt-Token``, checked (a route dependency) before
the request's body is read. The check answers the same whether or not the attempt exists, so a
guessed capture key reveals nothing: no token is 401 ``missing_attempt_token``; a token that is not
the attempt's, for an attempt that does not exist, or for one opened before attempts had a token
(its event holds no digest), is 403 ``invalid_attempt_token``. Digests are compared with
``hmac.compare_digest``, against a dummy digest when there is none, so the time taken does not say
which case it was.

Opening again: the same fields with the attempt's token answer as the first opening did (the token
is the caller's own); without it, or with another, the answer is 409 ``attempt_exists`` and
nothing else is said. A retry therefore never hands out a second token, and a harness that holds
its token is never locked out. Opening an attempt is guarded by the gateway token alone
(``--auth-token``), which every ``/v1`` request carries when one is set.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Final

from fastapi import Depends, Header
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field

from grove.capture.conflicts import opened_differences
from grove.capture.lifecycle import CaptureService
from grove.capture.refusals import Refused
from grove.capture.wire import AttemptStatus, OpenAttemptRequest, attempt_status
from grove.ledger.attempt import AttemptState
from grove.ledger.errors import EventIdConflict

__all__ = [
    "ATTEMPT_TOKEN_HEADER",
    "SOURCE_TOKEN_HEADER",
    "AttemptToken",
    "OpenedAttempt",
    "SourceToken",
    "attempt_token_digest",
    "gateway_token_check",
    "new_attempt_token",
    "open_with_token",
    "proposed_token",
    "refuse_reopening",
    "require_attempt_token",
    "require_source_token",
]

ATTEMPT_TOKEN_HEADER: Final = "X-Grove-Attempt-Token"
"""Request header holding the attempt's secret; required on every request on an opened attempt."""

SOURCE_TOKEN_HEADER: Final = "X-Grove-Source-Attempt-Token"
"""Request header holding the fork source's attempt token: opening a fork reads the source
attempt's conversation, so it takes that attempt's secret (``docs/security.md``)."""

_PROPOSED: Final = re.compile(r"[A-Za-z0-9_-]{32,128}")
_TAG: Final = b"grove-attempt-token/v1\x00"
_NO_DIGEST: Final = "0" * 64  # compared against when there is no recorded digest

AttemptToken = Annotated[
    str | None,
    Header(alias=ATTEMPT_TOKEN_HEADER, description="the attempt's token, as opening it returned"),
]

SourceToken = Annotated[
    str | None,
    Header(alias=SOURCE_TOKEN_HEADER, description="a fork source's attempt token"),
]

BearerCredentials = Annotated[
    HTTPAuthorizationCredentials | None,
    Depends(HTTPBearer(auto_error=False, description="the gateway's auth token")),
]


class OpenedAttempt(AttemptStatus):
    """``POST /v1/attempts``: the attempt's status and its token (send it as
    ``X-Grove-Attempt-Token`` on every later request on the attempt)."""

    attempt_token: str = Field(description="the attempt's secret; only its digest is recorded")


def new_attempt_token() -> str:
    """A fresh attempt token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def attempt_token_digest(capture_key: str, token: str) -> str:
    """The digest the ledger records for ``token`` as the secret of ``capture_key`` (hex sha256;
    bound to the key, so one token shared by two attempts records two digests)."""
    key, secret = capture_key.encode(), token.encode()
    framed = _TAG + len(key).to_bytes(4, "big") + key + secret
    return hashlib.sha256(framed).hexdigest()


def proposed_token(header: str | None) -> str | None:
    """The token a client proposes when opening an attempt (None: the gateway makes one);
    400 ``invalid_attempt_token`` when it is too short, too long or outside the alphabet."""
    if header is None:
        return None
    if not _PROPOSED.fullmatch(header):
        raise Refused(
            400,
            "invalid_attempt_token",
            f"A proposed {ATTEMPT_TOKEN_HEADER} must be 32-128 characters of A-Z a-z 0-9 _ - "
            f"(got {len(header)} characters); send none and the gateway makes one",
        )
    return header


def require_attempt_token(state: AttemptState, token: str | None) -> None:
    """Refuse a request on ``state``'s attempt that does not carry its token: 401 without one,
    403 with another (also when no such attempt is open, or it has no recorded digest)."""
    key = state.capture_key
    if not token:
        raise Refused(
            401,
            "missing_attempt_token",
            f"Requests on attempt {key!r} need its token: send the {ATTEMPT_TOKEN_HEADER} header "
            "with the attempt_token that POST /v1/attempts answered (grove.client's Attempt and "
            "the openai clients it makes send it)",
        )
    if not _holds_token(state, token):
        raise Refused(
            403,
            "invalid_attempt_token",
            f"The {ATTEMPT_TOKEN_HEADER} header does not hold the token of an open attempt "
            f"{key!r}: send the attempt_token that opening it answered",
        )


def require_source_token(source: AttemptState, token: str | None) -> None:
    """Refuse the opening of a fork of ``source``'s call that does not carry ``source``'s token:
    401 without one, 403 with another (also when no such attempt is open), nothing written."""
    key = source.capture_key
    if not token:
        raise Refused(
            401,
            "missing_source_token",
            f"Opening a fork of attempt {key!r} reads its conversation, so it needs that "
            f"attempt's token: send the {SOURCE_TOKEN_HEADER} header with the attempt_token "
            "that opening it answered (grove.client's open_attempt sends it: source_token)",
        )
    if not _holds_token(source, token):
        raise Refused(
            403,
            "invalid_source_token",
            f"The {SOURCE_TOKEN_HEADER} header does not hold the token of an open attempt "
            f"{key!r}: send the attempt_token that opening the fork source answered",
        )


def _holds_token(state: AttemptState, token: str) -> bool:
    """Whether ``token`` is the secret of ``state``'s attempt (never for an attempt with no
    recorded digest), compared in constant time."""
    recorded = state.attempt_token_digest
    presented = attempt_token_digest(state.capture_key, token)
    return hmac.compare_digest(recorded or _NO_DIGEST, presented) and recorded is not None


def refuse_reopening(state: AttemptState, proposed: str | None) -> str:
    """The token of an attempt that is already open, when the opening carries it; else 409
    ``attempt_exists`` (saying nothing about the attempt)."""
    if proposed is not None and _holds_token(state, proposed):
        return proposed
    raise Refused(
        409,
        "attempt_exists",
        f"Capture key {state.capture_key!r} names an attempt that is already open: an opening "
        f"is repeated only with the attempt's own token (in {ATTEMPT_TOKEN_HEADER}); open "
        "another capture key for another rollout",
    )


def open_with_token(
    service: CaptureService, request: OpenAttemptRequest, proposed: str | None
) -> OpenedAttempt:
    """Open the attempt of ``request`` (resolved by ``AttemptSettings``) with the token
    ``proposed`` (None: a new one) and answer its status and token.

    The opening is appended first: a repeat with the attempt's token and the same fields is the
    identical event, an idempotent retry that writes nothing. Any other opening of an open
    attempt carries another event, which the ledger refuses (``EventIdConflict``, nothing
    written); only then is the attempt read, to answer 409 ``attempt_exists`` without its token,
    or 409 ``conflicting_event`` naming the fields that differ with it."""
    if request.forest_mode is None or request.selection_policy is None:
        raise ValueError("open_with_token takes a request resolved by AttemptSettings")
    token = proposed_token(proposed) or new_attempt_token()
    key = request.capture_key
    try:
        appended = service.open_attempt(
            key,
            rollout_id=request.rollout_id,
            prompt_group=request.prompt_group,
            rollout_index=request.rollout_index,
            policy_version=request.policy_version,
            forest_mode=request.forest_mode,
            selection_policy=request.selection_policy,
            seed=request.seed,
            attempt_token_digest=attempt_token_digest(key, token),
            fork_from=None
            if request.fork_from is None
            else (request.fork_from.capture_key, request.fork_from.call_id),
        )
    except EventIdConflict:
        state = service.state(key)
        if state.opened is None:
            raise
        refuse_reopening(state, None if proposed is None else token)
        differences = opened_differences(state.opened, request.model_dump()) or (
            "its model or template fingerprint (this gateway serves another)"
        )
        raise Refused(
            409,
            "conflicting_event",
            f"Attempt {key!r} is already open with other fields: {differences}. Opening again "
            "is idempotent only with the same fields; open another capture key for another "
            "rollout",
        ) from None
    held = service.log.held(key) if appended is not None else None
    state = held if held is not None else service.state(key)
    return OpenedAttempt(**attempt_status(state).model_dump(), attempt_token=token)


def gateway_token_check(token: str) -> Callable[..., Awaitable[None]]:
    """The dependency that every ``/v1`` route of a gateway with an auth token runs: 401
    ``invalid_api_key`` unless ``Authorization: Bearer <token>`` holds ``token`` (checked on the
    event loop: it reads nothing)."""
    expected = token.encode()

    async def authorize(credentials: BearerCredentials) -> None:
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), expected
        ):
            raise Refused(
                401,
                "invalid_api_key",
                "This gateway needs 'Authorization: Bearer <token>' with its auth token (the "
                "openai client sends its api_key so)",
            )

    return authorize
