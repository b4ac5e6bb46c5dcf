"""The vLLM engine: exact token ids to a vLLM OpenAI-compatible server and back.

One ``generate`` is one ``POST /v1/completions`` whose prompt is the token-id list, never text,
with ``return_token_ids`` (the generated ids come back as ``choices[0].token_ids``) and
``return_tokens_as_token_ids`` (each logprob entry names its token as ``token_id:N``, which is
checked against ``token_ids``); ``logprobs: 0`` asks for the sampled token's logprob alone. The
server also echoes ``prompt_token_ids``, checked equal to the prompt that was sent. Nothing is
detokenized or re-tokenized on the way. Request and response fields are those of vLLM 0.32
(``vllm/entrypoints/openai/completion/protocol.py``).

No truncation: ``truncate_prompt_tokens`` is never sent, and since vLLM silently lowers
``max_tokens`` to fit the context (``get_max_tokens`` in ``vllm/entrypoints/serve/utils/
api_utils.py``), prompt plus ``max_tokens`` is checked against the served ``max_model_len``
(read once from ``GET /v1/models``) before the request, as the embedded engine does; a server
refusal for length, and a ``length`` finish shorter than ``max_tokens``, raise too.

Exact logprobs: vLLM returns the raw model distribution's logprobs by default
(``--logprobs-mode raw_logprobs``), which are the sampling logprobs only at temperature 1 with
no top-k or top-p, so other values are refused. A server started with ``--logprobs-mode
processed_logprobs`` returns them after temperature, top-k and top-p; an engine told so passes
those parameters through. Every sampling parameter that shapes the distribution is sent
explicitly, so the server's ``generation_config.json`` defaults never apply.

Output constraints (``docs/engines.md``, "Structured output on vLLM"): a call with one sends the
grammar ``capture/grammar.py`` builds as vLLM's ``structured_outputs: {"grammar": ...}``, the same
text the embedded engine decodes under. vLLM masks the logits with the grammar's bitmask before
its sampler (``apply_grammar_bitmask`` in its model runner), so the logprobs it returns, raw or
processed, are those of the masked, renormalized distribution the token was drawn from.

Weight updates (``docs/engines.md``): :meth:`VllmEngine.reload_weights` asks the server to read
new weights from a directory, in place, through vLLM's development endpoint ``POST
/collective_rpc`` (method ``reload_weights``, keyword ``weights_path``), which a server exposes
only when started with ``VLLM_SERVER_DEV_MODE=1``. :meth:`~VllmEngine.updating` holds off this
engine's generations while the weights change (those in flight finish first, new ones wait), so
none straddles an update and each is sampled by the weights of one ``policy_version``.
:meth:`~VllmEngine.set_weight_version` records the version the server reports at ``GET
/weight_info`` (a development endpoint too; without it, it returns False).

Errors (under :class:`grove.capture.errors.EngineError`)::

    EngineError
    ├── EngineUnavailableError   the server could not be reached or did not answer in time
    ├── EngineRejectedError      the server answered with an error status
    │   └── WeightUpdateUnavailableError   no /collective_rpc: started without dev mode
    ├── ModelNotServedError      the model is not among the server's models
    └── EngineResponseError      a success response that is not the expected shape
    (and, from grove.capture.errors: PromptTooLongError, InvalidPromptError,
    UnsupportedSamplingError)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, Literal, cast

import httpx

from grove.capture.engine import FINISH_REASONS, FinishReason, Generation, SamplingParams
from grove.capture.errors import (
    EngineError,
    InvalidPromptError,
    PromptTooLongError,
    UnsupportedSamplingError,
)
from grove.capture.grammar import grammar_text

__all__ = [
    "EngineRejectedError",
    "EngineResponseError",
    "EngineUnavailableError",
    "LogprobsMode",
    "ModelNotServedError",
    "VllmEngine",
    "WeightUpdateUnavailableError",
    "checked_finish",
    "only_choice",
]

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]

# The server's refusals for length name these parameters (vllm/renderers/params.py).
_LENGTH_PARAMS: Final = frozenset({"input_tokens", "max_tokens"})
_CONTEXT_IN_MESSAGE: Final = re.compile(r"maximum context length is (\d+)|max_model_len=(\d+)")
_TOKEN_ID_LABEL: Final = "token_id:{}"


class EngineUnavailableError(EngineError):
    """The server could not be reached, or the exchange failed in transport (connection,
    timeout, protocol); ``detail`` names the underlying httpx error."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"The vLLM server did not answer at {url}: {detail}")


class EngineRejectedError(EngineError):
    """The server answered with an error status; ``message`` and ``param`` (the request field
    it names, if any) are the server's own."""

    def __init__(self, url: str, status: int, message: str, param: str | None = None) -> None:
        self.url = url
        self.status = status
        self.message = message
        self.param = param
        super().__init__(f"The vLLM server at {url} refused the request (HTTP {status}): {message}")


class WeightUpdateUnavailableError(EngineRejectedError):
    """The server has no ``/collective_rpc`` endpoint (HTTP 404), so it cannot reload weights:
    vLLM exposes it only when started with ``VLLM_SERVER_DEV_MODE=1``."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        self.status = 404
        self.message = message
        self.param = None
        EngineError.__init__(
            self,
            f"The vLLM server at {url} cannot reload weights: it has no /collective_rpc "
            "endpoint (HTTP 404). Restart it with the environment variable "
            "VLLM_SERVER_DEV_MODE=1, which enables vLLM's weight-reload endpoint.",
        )


class ModelNotServedError(EngineError):
    """The configured model is not among those the server lists at ``/v1/models``."""

    def __init__(self, url: str, model: str, served: Sequence[str]) -> None:
        self.url = url
        self.model = model
        self.served = tuple(served)
        super().__init__(
            f"The vLLM server at {url} must serve model {model!r}; it serves {list(self.served)}"
        )


class EngineResponseError(EngineError):
    """A success response that breaks the completions contract this engine relies on."""

    def __init__(self, url: str, rule: str, got: object) -> None:
        self.url = url
        self.rule = rule
        self.got = got
        super().__init__(f"Unexpected response from the vLLM server at {url}: {rule}; got {got!r}")


class VllmEngine:
    """An :class:`grove.capture.engine.Engine` over a vLLM OpenAI-compatible server.

    ``base_url`` is the server root (``http://host:port``; a trailing ``/v1`` is accepted);
    ``model`` the served model name; ``timeout_s`` bounds each HTTP exchange; ``api_key``, when
    set, is sent as a bearer token. ``logprobs_mode`` must match the server's
    ``--logprobs-mode``. Safe to call from several threads; :meth:`close` releases the client.
    ``policy_version`` (the optimizer steps in the served weights, set by whoever loads them)
    is read when a request is sent and reported on its generation.
    """

    name: Final = "vllm"
    policy_version: int = 0

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float,
        api_key: str | None = None,
        logprobs_mode: LogprobsMode = "raw_logprobs",
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.logprobs_mode = logprobs_mode
        headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)
        self._context_length: int | None = None
        self._lock = threading.Lock()
        self._turns = threading.Condition()  # generations in flight versus a weight update
        self._in_flight = 0
        self._updates_waiting = 0
        self._updater: int | None = None  # the thread inside updating(), and how deep
        self._update_depth = 0

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client; the engine is unusable afterwards."""
        self._client.close()

    def model_cards(self) -> list[dict[str, Any]]:
        """The server's ``GET /v1/models`` cards (``id``, ``root``: the path it was started on,
        ``max_model_len``, ...)."""
        body = self._send("GET", "/v1/models", None)
        cards = body.get("data") if isinstance(body, dict) else None
        if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
            raise EngineResponseError(
                self._url("/v1/models"), "a model list has a list of model cards as data", body
            )
        return cards

    def reload_weights(self, weights_path: str, *, timeout_s: float | None = None) -> None:
        """Have the server read its weights again, in place, from the Hugging Face directory
        ``weights_path`` (a path on the server's file system); returns when they are loaded.

        Raises :class:`WeightUpdateUnavailableError` when the server was started without
        ``VLLM_SERVER_DEV_MODE=1``; ``timeout_s`` (default: the engine's) bounds the exchange.
        """
        request = {"method": "reload_weights", "kwargs": {"weights_path": weights_path}}
        try:
            self._send("POST", "/collective_rpc", request, timeout_s=timeout_s, empty_ok=True)
        except EngineRejectedError as error:
            if error.status == 404:
                raise WeightUpdateUnavailableError(error.url, error.message) from error
            raise

    def set_weight_version(self, version: str) -> bool:
        """Record ``version`` as the server's weight version (``POST /update_weight_version``);
        False when the server has no such endpoint."""
        try:
            self._send("POST", "/update_weight_version", {"new_version": version})
        except EngineRejectedError as error:
            if error.status == 404:
                return False
            raise
        return True

    @contextmanager
    def updating(self) -> Iterator[None]:
        """Hold off generation while the server's weights (and ``policy_version``) change: the
        generations in flight finish first, and new ones start after the block exits. One
        update at a time; the thread that holds it may enter again."""
        me = threading.get_ident()
        with self._turns:
            if self._updater == me:
                self._update_depth += 1
            else:
                self._updates_waiting += 1
                try:
                    self._turns.wait_for(lambda: self._in_flight == 0 and self._updater is None)
                finally:
                    self._updates_waiting -= 1
                self._updater, self._update_depth = me, 1
        try:
            yield
        finally:
            with self._turns:
                self._update_depth -= 1
                if self._update_depth == 0:
                    self._updater = None
                    self._turns.notify_all()

    @contextmanager
    def _generating(self) -> Iterator[int]:
        """A generation's turn: waits out an update (and one that waits), unless its own thread
        holds it; yields the version."""
        with self._turns:
            me = threading.get_ident()
            self._turns.wait_for(
                lambda: self._updater == me or (self._updater is None and not self._updates_waiting)
            )
            self._in_flight += 1
            version = self.policy_version
        try:
            yield version
        finally:
            with self._turns:
                self._in_flight -= 1
                self._turns.notify_all()

    def weight_version(self) -> str | None:
        """The weight version the server reports (``GET /weight_info``), None without one."""
        try:
            body = self._send("GET", "/weight_info", None)
        except EngineRejectedError as error:
            if error.status == 404:
                return None
            raise
        version = body.get("weight_version") if isinstance(body, dict) else None
        return None if version is None else str(version)

    def context_length(self) -> int:
        """The served model's ``max_model_len``, read from ``GET /v1/models`` once and kept."""
        with self._lock:
            if self._context_length is None:
                self._context_length = self._read_context_length()
            return self._context_length

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """Sample one generation after ``prompt_token_ids`` on the server."""
        prompt = list(prompt_token_ids)
        self.check(prompt, sampling)
        with self._generating() as version:
            body = self._post("/v1/completions", self._request(prompt, sampling), prompt, sampling)
        return replace(self._generation(body, prompt, sampling), policy_version=version)

    def check(self, prompt: Sequence[int], sampling: SamplingParams) -> None:
        """Raise the refusal ``generate`` would give, before anything is recorded."""
        prompt = list(prompt)
        if self.logprobs_mode == "raw_logprobs":
            for name, got, supported in (
                ("temperature", sampling.temperature, 1.0),
                ("top_p", sampling.top_p, 1.0),
                ("top_k", sampling.top_k, 0),
            ):
                if got != supported:
                    engine = f"{self.name} (server --logprobs-mode raw_logprobs)"
                    raise UnsupportedSamplingError(engine, name, got, supported)
        if sampling.constraint is not None:
            grammar_text(sampling.constraint)  # a schema it cannot enforce is refused here
        if not prompt:
            raise InvalidPromptError("a prompt has at least one token", prompt)
        negative = sorted({t for t in prompt if isinstance(t, bool) or t < 0})
        if negative:
            raise InvalidPromptError("token ids must be integers >= 0", negative[:10])
        context = self.context_length()
        if len(prompt) + sampling.max_tokens > context:
            raise PromptTooLongError(len(prompt), sampling.max_tokens, context)

    def _request(self, prompt: list[int], sampling: SamplingParams) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "seed": sampling.seed,
            "stop_token_ids": list(sampling.stop_token_ids),
            "n": 1,
            "stream": False,
            "echo": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if sampling.constraint is not None:
            request["structured_outputs"] = {"grammar": grammar_text(sampling.constraint)}
        return request

    def _read_context_length(self) -> int:
        url = self._url("/v1/models")
        cards = self.model_cards()
        card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            raise ModelNotServedError(url, self.model, [str(c.get("id")) for c in cards])
        context = card.get("max_model_len")
        if not isinstance(context, int) or isinstance(context, bool) or context < 1:
            raise EngineResponseError(url, "a model card states max_model_len >= 1", card)
        return context

    def _post(
        self, path: str, request: dict[str, Any], prompt: list[int], sampling: SamplingParams
    ) -> Any:
        try:
            return self._send("POST", path, request)
        except EngineRejectedError as error:
            context = self._refused_context(error)
            if context is None:
                raise
            raise PromptTooLongError(len(prompt), sampling.max_tokens, context) from error

    def _refused_context(self, error: EngineRejectedError) -> int | None:
        """The context length of a refusal for length, else None."""
        if error.status != 400 or error.param not in _LENGTH_PARAMS:
            return None
        match = _CONTEXT_IN_MESSAGE.search(error.message)
        if match is None:
            return self.context_length()
        return int(match.group(1) or match.group(2))

    def _send(
        self,
        method: str,
        path: str,
        request: dict[str, Any] | None,
        *,
        timeout_s: float | None = None,
        empty_ok: bool = False,
    ) -> Any:
        url = self._url(path)
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            response = self._client.request(method, path, json=request, timeout=timeout)
        except httpx.HTTPError as error:
            raise EngineUnavailableError(url, f"{type(error).__name__}: {error}") from error
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_error:
            param = _error_field(body, "param")
            raise EngineRejectedError(
                url,
                response.status_code,
                _error_message(body, response),
                param if isinstance(param, str) else None,
            )
        if body is None and not (empty_ok and not response.content):
            raise EngineResponseError(url, "a success response is JSON", response.text[:200])
        return body

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _generation(self, body: Any, prompt: list[int], sampling: SamplingParams) -> Generation:
        url = self._url("/v1/completions")
        choice = only_choice(url, body, "a completion")
        echoed = choice.get("prompt_token_ids")
        if echoed != prompt:
            raise EngineResponseError(
                url, f"the echoed prompt equals the {len(prompt)} tokens sent", _clip(echoed)
            )
        token_ids = choice.get("token_ids")
        if not _is_int_list(token_ids) or not token_ids:
            raise EngineResponseError(url, "token_ids is a non-empty list of integers", token_ids)
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            raise EngineResponseError(url, "logprobs were returned", logprobs)
        labels = [_TOKEN_ID_LABEL.format(t) for t in token_ids]
        if logprobs.get("tokens") != labels:
            raise EngineResponseError(
                url, "logprob tokens name token_ids as token_id:N", logprobs.get("tokens")
            )
        values = logprobs.get("token_logprobs")
        if not isinstance(values, list) or not all(
            isinstance(v, float | int) and not isinstance(v, bool) for v in values
        ):
            raise EngineResponseError(url, "token_logprobs is a list of numbers", values)
        return Generation(
            token_ids=tuple(token_ids),
            logprobs=tuple(float(v) for v in values),
            finish_reason=checked_finish(url, choice, sampling, len(token_ids)),
        )


def only_choice(url: str, body: Any, what: str) -> dict[str, Any]:
    """The one choice of a generation's reply body (``what`` names the reply in the error);
    ``EngineResponseError`` unless ``body["choices"]`` is a list of exactly one object."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise EngineResponseError(url, f"{what} has exactly one choice", choices)
    return choices[0]


def checked_finish(
    url: str, choice: dict[str, Any], sampling: SamplingParams, generated: int
) -> FinishReason:
    """The choice's finish reason, once it is one Grove records and, for ``length``, the
    ``generated`` tokens are ``sampling.max_tokens`` (vLLM lowers ``max_tokens`` to fit the
    context without saying so; Grove checks the length first, so a shorter one is refused)."""
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise EngineResponseError(url, f"finish_reason is one of {sorted(FINISH_REASONS)}", finish)
    if finish == "length" and generated != sampling.max_tokens:
        raise EngineResponseError(
            url,
            f"a length finish has max_tokens={sampling.max_tokens} tokens (the server must "
            "not lower max_tokens)",
            generated,
        )
    return cast(FinishReason, finish)  # one of FINISH_REASONS, checked above


def _error_message(body: Any, response: httpx.Response) -> str:
    message = _error_field(body, "message")
    return message if isinstance(message, str) else response.text[:500]


def _error_field(body: Any, key: str) -> Any:
    """A field of vLLM's error body: ``{"error": {...}}`` (0.10 on) or the flat older shape."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    return (inner if isinstance(inner, dict) else body).get(key)


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _clip(value: object) -> object:
    return value[:20] if isinstance(value, list) else value
