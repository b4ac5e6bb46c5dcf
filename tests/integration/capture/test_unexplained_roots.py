"""Unexplained roots, strict capture and the attempt's fixed options through the capture write
path, on both ledger databases (local blobs: the rules do not depend on the blob backend).

The service's tokenizer writes `` (turn N)`` into the system prompt of a conversation with N
answers (``tests/fixtures/templates.py``), so every continuation roots
``rendered_history_differs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.engine import SamplingParams
from grove.capture.errors import AttemptOptionsChangedError, UnexplainedRootError
from grove.capture.lifecycle import CallOutcome, CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.admission import DecisionKind, RootReason
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from tests.fixtures.templates import turn_marking_tokenizer

OPTIONS = RenderOptions(model="grove-tiny")
SAMPLING = SamplingParams(max_tokens=4)
SYSTEM = {"role": "system", "content": "You count apples."}
TASK = {"role": "user", "content": "Count the apples."}
FOLLOW_UP = {"role": "user", "content": "And the pears?"}
TOOL = {"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}

Factory = Callable[..., CaptureService]


@cache
def turn_marking() -> Renderer:
    return Renderer(turn_marking_tokenizer())


@cache
def chatml() -> Renderer:
    return Renderer(build_tokenizer())


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Factory]:
    """Capture services on one ledger and blob directory; attempt ``att-1`` opened by the first."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    blobs = open_blob_store(str(tmp_path / "blobs"))
    opened: list[CaptureService] = []

    def service(renderer: Renderer | None = None, *, strict: bool = False) -> CaptureService:
        renderer = renderer or turn_marking()
        engine = EmbeddedEngine.build(renderer.tokenizer, seed=5)
        log = AttemptLog(store)
        capture = CaptureService(
            log, blobs, renderer, engine, model_fingerprint="grove-tiny", strict=strict
        )
        if not opened:
            capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
        opened.append(capture)
        return capture

    try:
        yield service
    finally:
        store.close()


def ask(
    service: CaptureService, messages: list[dict], call_id: str, options: RenderOptions = OPTIONS
) -> CallOutcome:
    return service.generate("att-1", ModelCall(messages, options, SAMPLING, call_id))


def written(service: CaptureService) -> tuple[int, int]:
    return service.log.store.count(), len(service.blobs.list_keys())


def test_an_unexplained_root_records_its_divergence_on_its_intent(services: Factory):
    service = services()
    first = ask(service, [SYSTEM, TASK], "c1")
    second = ask(service, [SYSTEM, TASK, first.message, FOLLOW_UP], "c2")

    assert (second.decision.kind, second.decision.reason) == (
        DecisionKind.ROOT,
        RootReason.RENDERED_HISTORY_DIFFERS,
    )
    admission = service.log.load("att-1").calls["c2"].intended.admission
    divergence = admission["divergence"]
    assert (divergence["message_index"], divergence["cause"]) == (0, "changed_content")
    assert divergence["char_offset"] == len("<|im_start|>system\nYou count apples.")
    assert divergence["parent"]["side"] == "parent"
    assert "divergence" not in service.log.load("att-1").calls["c1"].intended.admission


def test_strict_capture_refuses_an_unexplained_root_and_writes_nothing(services: Factory):
    service = services(strict=True)
    first = ask(service, [SYSTEM, TASK], "c1")
    before = written(service)
    request = [SYSTEM, TASK, first.message, FOLLOW_UP]

    with pytest.raises(UnexplainedRootError, match="diverged at message 0") as refused:
        ask(service, request, "c2")
    with pytest.raises(UnexplainedRootError):
        service.measure("att-1", ModelCall(request, OPTIONS, SAMPLING))

    assert refused.value.candidate_call_id == "c1"
    assert written(service) == before
    assert list(service.log.load("att-1").calls) == ["c1"]


def test_strict_capture_still_continues_and_roots_rewrites(services: Factory):
    service = services(chatml(), strict=True)
    first = ask(service, [SYSTEM, TASK], "c1")
    second = ask(service, [SYSTEM, TASK, first.message, FOLLOW_UP], "c2")
    rewritten = ask(service, [SYSTEM, FOLLOW_UP], "c3")
    assert second.decision.kind is DecisionKind.CONTINUATION
    assert rewritten.decision.reason is RootReason.HISTORY_REWRITTEN


def test_every_intent_records_its_fixed_options(services: Factory):
    service = services()
    ask(service, [SYSTEM, TASK], "c1")
    fixed = service.log.load("att-1").calls["c1"].intended.admission["fixed_options"]
    assert (fixed["model"], fixed["template_kwargs"]) == ("grove-tiny", {})


def test_a_call_that_changes_the_template_kwargs_is_refused_and_writes_nothing(
    services: Factory,
):
    service = services(chatml())
    ask(service, [SYSTEM, TASK], "c1")
    before = written(service)
    thinking = dataclasses.replace(OPTIONS, template_kwargs={"enable_thinking": False})

    with pytest.raises(AttemptOptionsChangedError) as refused:
        ask(service, [SYSTEM, FOLLOW_UP], "c2", thinking)

    assert (refused.value.option, refused.value.got, refused.value.expected) == (
        "template_kwargs",
        {"enable_thinking": False},
        {},
    )
    assert written(service) == before


def test_a_replica_serving_another_chat_template_is_refused_by_the_attempt(services: Factory):
    opener = services(chatml())
    first = ask(opener, [SYSTEM, TASK], "c1")
    replica = services(turn_marking())  # the same ledger and model name, another template
    before = written(replica)

    with pytest.raises(AttemptOptionsChangedError, match=r"this call's chat template \(sha256"):
        ask(replica, [SYSTEM, TASK, first.message, FOLLOW_UP], "c2")
    assert written(replica) == before


def test_a_call_offering_other_tools_roots_as_render_options_changed(services: Factory):
    service = services(chatml())
    first = ask(service, [SYSTEM, TASK], "c1")
    with_tools = dataclasses.replace(OPTIONS, tools=(TOOL,))
    second = ask(service, [SYSTEM, TASK, first.message, FOLLOW_UP], "c2", with_tools)
    assert (second.decision.reason, second.decision.candidate_call_id) == (
        RootReason.RENDER_OPTIONS_CHANGED,
        None,
    )
    assert second.decision.matched_call_ids == ("c1",)
