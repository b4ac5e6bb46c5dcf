"""The gateway's one error boundary: every failure answered as an OpenAI error object.

Every 4xx and 5xx answer is ``{"error": {"message", "type", "code", "param"}}``
(``grove.capture.wire.ErrorBody``): the message states the rule, the values and what to do. Sources,
each translated here and nowhere else:

- ``Refused``: a refusal only the HTTP layer knows (``n > 1``, a ``tool_choice`` the engine cannot
  honour, an unknown attempt, ...), raised with its own status and code;
- request validation: a malformed JSON body (``invalid_json``, the character position in the
  message), an unknown or mistyped field (``invalid_request``, the field as ``param``);
- routing: an unknown path (``not_found``) or method (``method_not_allowed``);
- Grove's errors (``grove.capture.errors``, ``grove.ledger.errors``, ``grove.storage.errors``),
through the one
  table ``grove.capture.wire.ERROR_STATUS``;
- anything else: 500 ``internal_error``. Its text may hold what a client must not see (a
  database URL, a path, a payload), so the answer names only an incident id, and the exception
  is logged with its traceback under that id (logger ``grove.capture.refusals``).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from grove.capture import errors as capture_errors
from grove.capture.wire import error_body, error_status
from grove.ledger import errors as ledger_errors
from grove.storage import errors as storage_errors

__all__ = [
    "REFUSED_FIELD_REASONS",
    "Refused",
    "error_response",
    "install_error_handlers",
    "validation_refusal",
]

logger = logging.getLogger(__name__)

REFUSED_FIELD_REASONS: dict[str, str] = {
    "prompt_cache_key": (
        "Grove keeps no provider-side prompt cache (every prompt is rendered, recorded and "
        "served whole); leave it out"
    ),
}
"""Why Grove refuses a request field that agent frameworks send, by field name; any other unknown
field is refused with a pointer to ``docs/gateway.md`` ("Agent frameworks" lists these)."""


class Refused(Exception):
    """A refusal only the HTTP layer knows; answered as an OpenAI error body, never raised out.

    ``param`` names the offending request field, if there is one.
    """

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        super().__init__(message)


def error_response(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    """The JSON answer for a refusal or failure (401 also asks for a bearer token)."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = error_body(status, code, message, param)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def validation_refusal(errors: list[dict[str, Any]]) -> Refused:
    """The refusal for a body that failed validation: malformed JSON, or the fields at fault."""
    for item in errors:
        if item["type"] == "json_invalid":
            position = item["loc"][-1] if len(item["loc"]) > 1 else "?"
            reason = (item.get("ctx") or {}).get("error", item["msg"])
            return Refused(
                400,
                "invalid_request",
                f"The request body is not valid JSON: {reason} at character {position}; send "
                "one JSON object (Content-Type: application/json)",
            )
    problems = []
    params = []
    for item in errors:
        where = ".".join(str(part) for part in item["loc"] if part != "body") or "body"
        params.append(where)
        if item["type"] == "extra_forbidden":
            reason = REFUSED_FIELD_REASONS.get(where, "Grove does not accept this field")
            problems.append(f"{where}: {reason} (see docs/gateway.md)")
        else:
            problems.append(f"{where}: {item['msg']}")
    return Refused(
        400,
        "invalid_request",
        "Invalid request: " + "; ".join(problems),
        params[0] if params else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` with the gateway's error object (module docstring)."""

    async def refused(request: Request, error: Exception) -> JSONResponse:
        if not isinstance(error, Refused):  # registered for this type only
            raise error
        return error_response(error.status, error.code, error.message, error.param)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        if not isinstance(error, RequestValidationError):  # registered for this type only
            raise error
        return await refused(request, validation_refusal(list(error.errors())))

    async def routing(request: Request, error: Exception) -> JSONResponse:
        if not isinstance(error, HTTPException):  # registered for this type only
            raise error
        where = f"{request.method} {request.url.path}"
        if error.status_code == 404:
            return error_response(
                404,
                "not_found",
                f"No such route: {where}; the gateway's routes are listed in docs/gateway.md "
                "and at /openapi.json",
            )
        if error.status_code == 405:
            return error_response(
                405,
                "method_not_allowed",
                f"{where} is not allowed; see docs/gateway.md for the methods of each route",
            )
        return error_response(error.status_code, "http_error", f"{where}: {error.detail}")

    async def grove(request: Request, error: Exception) -> JSONResponse:
        answer = error_status(error)
        return error_response(answer.status, answer.code, str(error))

    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        incident = uuid.uuid4().hex[:12]
        logger.error(
            "internal error %s answering %s %s",
            incident,
            request.method,
            request.url.path,
            exc_info=error,
        )
        return error_response(
            500,
            "internal_error",
            f"Internal error {incident}: the gateway failed in a way it does not expect; its "
            "log holds the details under this id",
        )

    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, routing)
    for root in (
        capture_errors.CaptureError,
        ledger_errors.LedgerError,
        storage_errors.StorageError,
    ):
        app.add_exception_handler(root, grove)
    app.add_exception_handler(Exception, unexpected)
