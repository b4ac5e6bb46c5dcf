"""The capture package's errors, one tree.

::

    CaptureError
    ├── NormalizationError        an item normalization cannot map (docs/normalization.md)
    ├── RenderError               the chat template failed to render the messages
    ├── TemplateTokenError        message text whose special-token text cannot be kept as text
    │                               (capture/template_tokens.py; answered as a RenderError)
    ├── SpliceError               a prompt plan that lacks, or contradicts, its token evidence
    ├── AttemptOptionsChangedError  a call whose model or template configuration is not the
    │                               attempt's (docs/normalization.md, "Fixed per attempt")
    ├── UnexplainedRootError      strict capture: a call the template cannot continue from its
    │                               parent's exact tokens (docs/normalization.md, "Strict mode")
    ├── MediaError                an image the call cannot take (docs/media.md)
    │   ├── InvalidImageError         an image part that is not a decodable data URL
    │   ├── ImagesNotSupportedError   images sent to a model served without an image processor
    │   └── RetainedMediaMismatchError  a continuation's retained image differs from the one
    │                                   its parent chain captured
    └── EngineError               inference refused or failed
        ├── InvalidSamplingError      sampling parameters out of range
        ├── UnsupportedSamplingError  valid parameters this engine cannot honour exactly
        ├── InvalidPromptError        an empty prompt, or token ids outside the vocabulary
        ├── PromptTooLongError        prompt plus max_tokens exceed the context (no truncation)
        └── InvalidGenerationError    an engine result whose lengths disagree

Admission errors (assistant prefill, empty suffix, ambiguous parent) belong to the ledger:
``grove.ledger.admission.AdmissionError``. Every message states the rule, then the identifiers and
got-versus-expected values, which are also kept as attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grove_errors import GroveError

if TYPE_CHECKING:
    from grove.capture.divergence import Divergence

__all__ = [
    "AttemptOptionsChangedError",
    "CaptureError",
    "EngineError",
    "ImagesNotSupportedError",
    "InvalidGenerationError",
    "InvalidImageError",
    "InvalidPromptError",
    "InvalidSamplingError",
    "MediaError",
    "NormalizationError",
    "PromptTooLongError",
    "RenderError",
    "RetainedMediaMismatchError",
    "SpliceError",
    "UnexplainedRootError",
    "UnsupportedSamplingError",
]


class CaptureError(GroveError):
    """Root of every error the capture package raises."""


class NormalizationError(CaptureError, ValueError):
    """A request item that normalization cannot map; nothing is rendered or recorded."""

    def __init__(self, item_index: int, rule: str, got: object) -> None:
        self.item_index = item_index
        self.rule = rule
        self.got = got
        super().__init__(
            f"Cannot normalize request item {item_index}: {rule}; got {got!r} "
            "(see docs/normalization.md)"
        )


class RenderError(CaptureError):
    """The chat template raised while rendering."""

    def __init__(self, model: str, detail: str) -> None:
        self.model = model
        self.detail = detail
        super().__init__(f"The chat template of model {model!r} failed to render: {detail}")


class SpliceError(CaptureError):
    """A prompt plan whose token evidence is missing or contradicts the admission decision."""

    def __init__(self, rule: str, call_id: str | None) -> None:
        self.rule = rule
        self.call_id = call_id
        super().__init__(f"Cannot plan the prompt (parent call {call_id}): {rule}")


class AttemptOptionsChangedError(CaptureError):
    """A call whose model, chat template or template configuration differs from its attempt's;
    refused before anything is written."""

    def __init__(
        self, capture_key: str, option: str, got: object, expected: object, fixed_by: str
    ) -> None:
        self.capture_key = capture_key
        self.option = option
        self.got = got
        self.expected = expected
        self.fixed_by = fixed_by
        super().__init__(
            "The model and template configuration stay fixed during an attempt: in attempt "
            f"{capture_key!r} this call's {option} is {_short(got)}, the attempt's is "
            f"{_short(expected)} (fixed by {fixed_by}); send every call of the attempt with the "
            "attempt's model, chat template, template kwargs and processor kwargs, or open a new "
            "attempt for the new configuration (docs/normalization.md)"
        )


class UnexplainedRootError(CaptureError):
    """Strict capture refuses a call that would root unexplained: admission found the call it
    continues, and the template cannot extend that call's exact tokens."""

    def __init__(
        self, capture_key: str, reason: str, candidate_call_id: str | None, divergence: Divergence
    ) -> None:
        self.capture_key = capture_key
        self.reason = reason
        self.candidate_call_id = candidate_call_id
        self.divergence = divergence
        super().__init__(
            f"Strict capture refuses an unexplained root in attempt {capture_key!r}: the request "
            f"continues call {candidate_call_id}, but the boundary check failed ({reason}); "
            f"{divergence.describe()}\nMake the chat template and the client reproduce the "
            'parent\'s exact text (docs/normalization.md, "Divergence diagnostics"), or capture '
            "without strict mode to record the call as a root"
        )


class MediaError(CaptureError):
    """An image a model call cannot take; nothing is recorded (``docs/media.md``)."""


class InvalidImageError(MediaError, ValueError):
    """An image content part that is not a decodable ``data:`` URL of an image."""

    def __init__(self, message_index: int, image_index: int, rule: str, got: object) -> None:
        self.message_index = message_index
        self.image_index = image_index
        self.rule = rule
        self.got = got
        super().__init__(
            f"Image {image_index} of message {message_index} cannot be read: {rule}; got "
            f"{_short(got, 120)} (send images inline as data:image/png;base64,... URLs; "
            "docs/media.md)"
        )


class ImagesNotSupportedError(MediaError, ValueError):
    """Image parts sent to a model served without an image processor."""

    def __init__(self, model: str, message_index: int) -> None:
        self.model = model
        self.message_index = message_index
        super().__init__(
            f"Message {message_index} holds an image, but model {model!r} is served without an "
            "image processor: send text only, or serve a vision-language model (docs/media.md)"
        )


class RetainedMediaMismatchError(MediaError):
    """A continuation re-sends an image of its parent chain that no longer matches what the
    chain captured (pixel digest, patch grid or placeholder tokens); refused before inference."""

    def __init__(
        self,
        capture_key: str,
        parent_call_id: str,
        message_index: int,
        image_index: int,
        field: str,
        got: object,
        expected: object,
    ) -> None:
        self.capture_key = capture_key
        self.parent_call_id = parent_call_id
        self.message_index = message_index
        self.image_index = image_index
        self.field = field
        self.got = got
        self.expected = expected
        super().__init__(
            f"A retained image must match the image its parent chain captured: in attempt "
            f"{capture_key!r}, image {image_index} of message {message_index} (continuing call "
            f"{parent_call_id!r}) has {field} {_short(got, 120)}, the captured image has "
            f"{_short(expected, 120)}; re-send retained images unchanged, with the same "
            "processor settings, or start a new context (docs/media.md)"
        )


class EngineError(CaptureError):
    """Inference was refused or failed; the lifecycle records ``call.failed`` (engine_error)."""


class InvalidSamplingError(EngineError, ValueError):
    """A sampling parameter out of its range."""

    def __init__(self, name: str, got: object, expected: str) -> None:
        self.name = name
        self.got = got
        self.expected = expected
        super().__init__(f"Invalid sampling parameter {name}: got {got!r}, expected {expected}")


class UnsupportedSamplingError(EngineError, ValueError):
    """Valid sampling parameters that this engine cannot honour with exact logprobs."""

    def __init__(self, engine: str, name: str, got: object, supported: object) -> None:
        self.engine = engine
        self.name = name
        self.got = got
        self.supported = supported
        super().__init__(
            f"The {engine} engine samples from the raw distribution so that recorded logprobs are "
            f"exact: {name} must be {supported!r}, got {got!r}"
        )


class InvalidPromptError(EngineError, ValueError):
    """An empty prompt, or prompt token ids outside the model's vocabulary."""

    def __init__(self, rule: str, got: object) -> None:
        self.rule = rule
        self.got = got
        super().__init__(f"Invalid prompt: {rule}; got {got!r}")


class PromptTooLongError(EngineError, ValueError):
    """Prompt plus max_tokens exceed the context; engine-side truncation is not supported."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        super().__init__(
            "Prompt tokens plus max_tokens must fit the model's context (prompts are never "
            f"truncated): got {prompt_tokens} + {max_tokens} = {prompt_tokens + max_tokens}, "
            f"context is {context_length}; shorten the request or lower max_tokens"
        )


class InvalidGenerationError(EngineError):
    """An engine result whose token, logprob and route lengths disagree."""

    def __init__(self, rule: str, got: object) -> None:
        self.rule = rule
        self.got = got
        super().__init__(f"Invalid generation from the engine: {rule}; got {got!r}")


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
