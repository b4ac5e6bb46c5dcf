"""Concurrency: each call id is intended and inferred once, however requests race.

The deterministic specification runs in this process (a second request for the same call arrives
while the first is in inference); the load test runs 8 client processes against one ``grove serve``
on PostgreSQL and S3 (``test_concurrent_clients_lose_nothing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from capture.engine import Engine, Generation, SamplingParams
from capture.lifecycle import CaptureService, ModelCall
from capture.render import RenderOptions
from ledger.attempt import AttemptError

from .conftest import MODEL

USER = {"role": "user", "content": "Describe the weather in plain words."}
CALL = ModelCall([USER], RenderOptions(model=MODEL), SamplingParams(max_tokens=4), "c0")


class RacingEngine:
    """An engine whose first inference first lets ``race`` run: a second request for the same
    call arriving while the first one is being inferred. What ``race`` raised is kept."""

    def __init__(self, inner: Engine, race: Callable[[], object]) -> None:
        self.inner = inner
        self._race: Callable[[], object] | None = race
        self.raised: BaseException | None = None

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.inner.check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        race, self._race = self._race, None
        if race is not None:
            try:
                race()
            except BaseException as error:
                self.raised = error
        return self.inner.generate(prompt_token_ids, sampling)


def test_a_racing_request_for_an_intended_call_is_refused_before_inference(
    capture: CaptureService,
):
    capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
    racing = RacingEngine(capture.engine, lambda: capture.generate("att-1", CALL))
    capture.engine = racing
    outcome = capture.generate("att-1", CALL)
    assert isinstance(racing.raised, AttemptError)
    with pytest.raises(AttemptError, match="already intended by another request"):
        raise racing.raised
    events = [
        (e.event_type, e.payload.get("call_id")) for e in capture.log.store.read_stream("att-1")
    ]
    assert events == [
        ("attempt.opened", None),
        ("call.intended", "c0"),
        ("call.committed", "c0"),
    ]
    assert capture.blobs.list_keys() == [outcome.blob.key]
