"""``grove fork --record``: each sample of a recorded call kept as an attempt of its own
(``docs/fork.md``, "Recording the samples").

Sample ``i`` of call ``C`` of attempt ``K`` becomes attempt ``K-fork-C-S`` (``S`` its seed),
recorded by Grove's capture service as the gateway records a harness's call: a fork
(``fork_from``) of ``C``'s parent when ``C`` is a continuation, an ordinary attempt when ``C`` is
a root. Its one call is ``C``'s request, sent again: the conversation of ``C``'s chain as its
blobs recorded it (``grove.capture.conversations``), up to ``C``'s answer, converted by the
gateway's own request conversion. Admission then continues ``C``'s parent on its stored chain,
so the call's prompt is ``C``'s, token for token; the attempt is settled at once and never
selected, so it never trains.

The ledger records a digest of a request's render options (model, tools, tool choice, ...),
not the options. Before anything is written, the options of the request sent again must have
``C``'s recorded digest: the model is the loaded one, and the tools are those ``--tools`` gives.
After each call the recorded prompt is compared with ``C``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from grove.capture.chat_api import ChatCompletionRequest
from grove.capture.conversations import chain_conversation, chat_messages
from grove.capture.conversion import ConvertedCall, RequestConverter
from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import Generation, SamplingParams
from grove.capture.lifecycle import CaptureService
from grove.capture.render import Renderer
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import AttemptOpened
from grove.ledger.store import EventStore
from grove.storage import BlobStore
from grove.tools.fork import ForkError, RecordedCall, read_recorded_call

__all__ = ["SAMPLE_CALL_ID", "ForkRecorder", "read_tools", "sample_key"]

SAMPLE_CALL_ID: Final = "sample"
"""The call id of the one call of a sample's attempt (a fork's calls never share its source
call's id; a recorded call's id is never this one's there, as no sample's is)."""


def sample_key(call: RecordedCall, seed: int) -> str:
    """The capture key of the attempt that records the sample of ``seed``."""
    return f"{call.capture_key}-fork-{call.call_id}-{seed}"


def read_tools(path: Path) -> list[dict[str, Any]]:
    """The Chat Completions tools in the JSON file ``path`` (a list of tool objects)."""
    try:
        tools = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ForkError(
            f"--tools {path} cannot be read as JSON ({error}); fix the file."
        ) from error
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ForkError(
            f"--tools {path} must hold a JSON list of Chat Completions tool objects, got "
            f"{type(tools).__name__}; write the list the call's request sent as `tools`."
        )
    return tools


class ForkRecorder:
    """A ``grove.tools.fork.SampleRecorder`` over the capture service (module docstring)."""

    def __init__(
        self,
        store: EventStore,
        blobs: BlobStore,
        call: RecordedCall,
        *,
        model_name: str,
        policy_version: int,
        tools: list[dict[str, Any]] | None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.call = call
        self.model_name = model_name
        self.policy_version = policy_version
        self.tools = tools
        self._service: CaptureService | None = None
        self._converter: RequestConverter | None = None
        self._messages: list[dict[str, Any]] = []
        self._opened: AttemptOpened | None = None

    def prepare(self, engine: EmbeddedEngine, sampling: Sequence[SamplingParams]) -> None:
        """Rebuild ``C``'s request and check it (its conversation recorded, its render options'
        digest ``C``'s, no sample's attempt recorded yet); writes nothing."""
        call, log = self.call, AttemptLog(self.store)
        self._opened = log.load(call.capture_key).opened
        conversation = chain_conversation(self.blobs, call.chain)
        if conversation is None or len(conversation) < call.request_items:
            raise ForkError(
                f"Call {call.call_id!r} of attempt {call.capture_key!r} cannot be sent again: "
                "a blob of its chain was written before Grove recorded each call's "
                "conversation, so its request's messages are unknown. Sample it without "
                "--record."
            )
        self._messages = chat_messages(conversation[: call.request_items])
        assert engine.tokenizer is not None  # EmbeddedPolicy builds it with the tokenizer
        renderer = Renderer(engine.tokenizer)
        self._converter = RequestConverter(self.model_name, 1, renderer)
        digest = renderer.options_digest(self._convert(sampling[0]).call.options)
        if digest != call.render_options_digest:
            given = "no tools" if self.tools is None else f"the {len(self.tools)} tools of --tools"
            raise ForkError(
                f"Call {call.call_id!r} of attempt {call.capture_key!r} was rendered under other "
                f"options than model {self.model_name!r} with {given} "
                f"(render options digest {call.render_options_digest[:12]}…, got {digest[:12]}…). "
                "The ledger records only their digest: pass the tools its request sent with "
                "--tools FILE.json, and the configuration of the model that served it. Nothing "
                "was written."
            )
        for params in sampling:
            key = sample_key(call, params.seed or 0)
            if log.load(key).opened is not None:
                raise ForkError(
                    f"Attempt {key!r} already records the sample of seed {params.seed}; pick "
                    "other seeds (--seed) to record new samples. Nothing was written."
                )
        assert self._opened is not None  # read_recorded_call found the attempt
        self._service = CaptureService(
            log, self.blobs, renderer, engine, model_fingerprint=self._opened.model_fingerprint
        )

    def _convert(self, sampling: SamplingParams) -> ConvertedCall:
        assert self._converter is not None
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": self._messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "seed": sampling.seed,
        }
        if self.tools is not None:
            body["tools"] = self.tools
        request = ChatCompletionRequest.model_validate(body)
        return self._converter.chat_call(request, SAMPLE_CALL_ID)

    def record(self, index: int, sampling: SamplingParams) -> tuple[Generation, str]:
        """Open the sample's attempt, run ``C``'s request through the capture service, settle;
        a recorded prompt other than ``C``'s is an error naming the attempt."""
        call, service, opened = self.call, self._service, self._opened
        assert service is not None and opened is not None  # prepare() ran
        key = sample_key(call, sampling.seed or 0)
        parent = call.parent_call_id
        service.open_attempt(
            key,
            rollout_id=key,
            prompt_group=f"{call.capture_key}-fork-{call.call_id}",
            rollout_index=index,
            policy_version=self.policy_version,
            forest_mode=opened.forest_mode,
            selection_policy=opened.selection_policy,
            template_fingerprint=opened.template_fingerprint,
            seed=sampling.seed,
            fork_from=None
            if parent is None
            else (call.source_capture_key or call.capture_key, parent),
        )
        outcome = service.generate(key, self._convert(sampling).call)
        service.settle(key, timeout_s=0.0)
        recorded = read_recorded_call(self.store, self.blobs, key, outcome.call_id)
        if recorded.prompt != call.prompt:
            raise ForkError(
                f"Attempt {key!r} recorded the sample on a prompt of {len(recorded.prompt)} "
                f"tokens, not call {call.call_id!r}'s {len(call.prompt)}: the request sent again "
                "was not admitted as the original was. The attempt stays in the ledger, settled "
                "and never selected; report this with grove replay's output for both attempts."
            )
        return outcome.generation, key
