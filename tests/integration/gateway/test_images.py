"""Images through the gateway: the tiny vision-language model (``capture/embedded_vlm.py``)
captured over real HTTP with the official ``openai`` client, verified on continuation, and
trained exactly (``docs/media.md``).

The example: call 1 sees image A, call 2 continues it and adds image B, call 3 is a rewrite that
keeps only B. The blobs hold A for call 1, only B for call 2, and B in full for call 3; the rows
are calls 1-2 with A+B and call 3 with B.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from openai import BadRequestError, ConflictError, OpenAI
from PIL import Image

from grove.capture.attempt_settings import AttemptSettings
from grove.capture.embedded_vlm import (
    IMAGE_TOKEN,
    EmbeddedVLMEngine,
    build_image_processor,
    build_vlm_renderer,
    build_vlm_tokenizer,
    vision_token_ids,
)
from grove.capture.gateway import CALL_ID_HEADER, create_app
from grove.capture.lifecycle import CaptureService
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import LedgerSelector, ServerThread
from grove.storage import BlobRef, CallDelta, open_blob_store
from grove.tools.show import write_attempt_page
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.finalization import decide
from grove.training.loss import DEFAULT_CLIP, token_diagnostics
from grove.training.media_logprobs import MediaLogprobs
from grove.training.trainer import StepBatch, Trainer

from .support import AttemptTokens, Gateway

MODEL = "grove/test-tiny-vl"
TOKENIZER = build_vlm_tokenizer()
IMAGE_ID = vision_token_ids(TOKENIZER)[IMAGE_TOKEN]


def image(seed: int, height: int, width: int) -> str:
    """A noise image drawn from ``seed``, as a PNG data URL."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


A = image(1, 56, 56)  # a 4 x 4 patch grid: 4 placeholder tokens
B = image(2, 28, 84)  # a 2 x 6 patch grid: 3 placeholder tokens


def chat_image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user(text: str, *urls: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}, *map(chat_image, urls)]}


@contextmanager
def serve_vlm(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway serving the tiny vision-language model on SQLite and local blobs, forest mode
    on."""
    database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    renderer = build_vlm_renderer(TOKENIZER)
    engine = EmbeddedVLMEngine.build(TOKENIZER, seed=5)
    service = CaptureService(
        AttemptLog(store),
        open_blob_store(str(tmp_path / "blobs")),
        renderer,
        engine,
        model_fingerprint=MODEL,
    )
    app = create_app(
        service,
        selector=LedgerSelector(),
        model_name=MODEL,
        attempts=AttemptSettings(forest_mode=True),  # its rows train as forests
        on_shutdown=store.close,
    )
    tokens = AttemptTokens()
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.base_url, event_hooks=tokens.hooks) as http,
    ):
        yield Gateway(server.base_url, service, http, server, tokens)


@pytest.fixture
def vlm(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway serving the tiny vision-language model (``serve_vlm``)."""
    with serve_vlm(tmp_path) as gateway:
        yield gateway


def delta(gateway: Gateway, call_id: str, capture_key: str = "att-1") -> CallDelta:
    committed = gateway.state(capture_key).calls[call_id].committed
    assert committed is not None
    ref = BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    return gateway.service.blobs.get_delta(ref)


@dataclass
class Example:
    """The three calls of the example, captured in attempt ``att-1``."""

    gateway: Gateway
    first: Any
    second: Any
    third: Any


def call(client: OpenAI, call_id: str, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        extra_headers={CALL_ID_HEADER: call_id},
    )


def echoed(completion: Any) -> dict[str, Any]:
    return completion.choices[0].message.model_dump(exclude_none=True)


@pytest.fixture
def example(vlm: Gateway) -> Example:
    vlm.open(selection_policy="all_captured", forest_mode=True)
    client = vlm.client()
    history = [user("look", A)]
    first = call(client, "c1", history)
    history += [echoed(first), user("and this", B)]
    second = call(client, "c2", history)
    third = call(client, "c3", [user("summary so far"), user("keep", B)])
    return Example(vlm, first, second, third)


def test_a_root_stores_its_image_pixels_grid_and_placeholder_span(example: Example):
    stored = delta(example.gateway, "c1")
    (item,) = stored.media
    d = item.descriptor
    assert (d.media_id, d.kind, d.frames, d.height, d.width) == (
        "message-0/image-0",
        "image",
        1,
        4,
        4,
    )
    assert stored.prompt_delta[d.token_start : d.token_end].tolist() == [IMAGE_ID] * 4
    assert item.pixels.shape == (16, 3 * 2 * 14 * 14)


def test_a_continuation_stores_only_its_new_image(example: Example):
    state = example.gateway.state()
    assert state.calls["c2"].parent_call_id == "c1"
    stored = delta(example.gateway, "c2")
    (item,) = stored.media
    d = item.descriptor
    assert (d.media_id, d.height, d.width) == ("message-2/image-0", 2, 6)
    assert stored.prompt_delta[d.token_start : d.token_end].tolist() == [IMAGE_ID] * 3
    assert int((stored.prompt_delta == IMAGE_ID).sum()) == 3  # A is not stored again


def test_a_rewrite_root_stores_its_current_image_in_full(example: Example):
    state = example.gateway.state()
    assert state.calls["c3"].parent_call_id is None
    (item,) = delta(example.gateway, "c3").media
    assert (item.descriptor.media_id, item.descriptor.height, item.descriptor.width) == (
        "message-1/image-0",
        2,
        6,
    )
    assert item.descriptor.digest == delta(example.gateway, "c2").media[0].descriptor.digest


def test_a_changed_retained_image_is_refused_409_before_inference_naming_it(example: Example):
    gateway = example.gateway
    renderer = gateway.service.renderer
    # The gateway now processes images differently (a new processor version, say): A's patch
    # grid as re-sent differs from the one call 1 captured.
    renderer.vision.image_processor = build_image_processor(max_pixels=28 * 28 * 2)
    renderer.vision._cache.clear()
    before = gateway.written()
    history = [user("look", A), echoed(example.first), user("and more")]
    with pytest.raises(ConflictError) as refused:
        call(gateway.client(), "c4", history)
    assert refused.value.status_code == 409
    body = refused.value.body
    assert body["code"] == "retained_media_mismatch"
    assert "image 0 of message 0" in body["message"] and "'c1'" in body["message"]
    assert gateway.written() == before


def test_responses_input_image_is_captured(vlm: Gateway):
    vlm.open()
    vlm.client().responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is it"},
                    {"type": "input_image", "image_url": B, "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=5,
        extra_headers={CALL_ID_HEADER: "r1"},
    )
    (item,) = delta(vlm, "r1").media
    assert (item.descriptor.height, item.descriptor.width) == (2, 6)


def test_an_image_that_is_not_a_data_url_is_refused_400(vlm: Gateway):
    vlm.open()
    before = vlm.written()
    with pytest.raises(BadRequestError) as refused:
        call(vlm.client(), "x", [user("look", "https://example.com/a.png")])
    assert refused.value.status_code == 400
    assert refused.value.body["code"] == "invalid_image"
    assert vlm.written() == before


def rows_of(example: Example) -> tuple[Any, ...]:
    gateway = example.gateway
    answer = gateway.http.post(
        "/v1/attempts/att-1/result", json={"reward": 1.0, "terminal_response_id": example.third.id}
    )
    assert answer.status_code == 200, answer.text
    decision = decide(
        gateway.state(), gateway.service.blobs, forest_training=True, max_row_tokens=None
    )
    assert decision.forest.trainable, decision.forest.masked_reason
    return decision.rows


def test_rows_carry_media_in_row_coordinates_and_a_rewrite_reowns_its_image(example: Example):
    first, second = rows_of(example)
    assert first.call_ids == ("c1", "c2") and second.call_ids == ("c3",)
    assert [(m.item.media_id, m.call_id, m.owned) for m in first.media] == [
        ("message-0/image-0", "c1", True),
        ("message-2/image-0", "c2", True),
    ]
    assert [(m.item.media_id, m.call_id, m.owned) for m in second.media] == [
        ("message-1/image-0", "c3", True)
    ]
    for row in (first, second):
        for placed in row.media:
            span = row.token_ids[placed.token_start : placed.token_end].tolist()
            assert span == [IMAGE_ID] * (placed.item.height * placed.item.width // 4)
    assert first.media[1].item.digest == second.media[0].item.digest


def step_batch(rows: tuple[Any, ...]) -> StepBatch:
    batch = assemble_batch(
        [LogicalRollout("r", "g", rows)], row_multiple=1, pad_token_id=TOKENIZER.pad_token_id
    )
    return StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=torch.ones(batch.input_ids.shape[0]),
        owners=batch.parent_indices,
        logical_rollouts=1,
        media=batch.media,
    )


def logprobs_function() -> MediaLogprobs:
    return MediaLogprobs(
        image_token_id=IMAGE_ID, excluded_token_ids=list(vision_token_ids(TOKENIZER).values())
    )


def test_recomputed_logprobs_with_the_captured_pixels_equal_the_generation_logprobs(
    example: Example,
):
    batch = step_batch(rows_of(example))
    model = example.gateway.service.engine.model
    with torch.no_grad():
        recomputed = logprobs_function()(model, batch, slice(0, batch.rows))
    diagnostics = token_diagnostics(
        recomputed,
        batch.generation_logprobs,
        batch.loss_mask,
        batch.owners,
        logical_rollouts=1,
    )
    assert int(batch.loss_mask.sum()) > 0
    assert diagnostics.max_token_mult_prob_error < 1.001


def test_the_trainer_takes_a_step_on_rows_with_images(example: Example):
    batch = step_batch(rows_of(example))
    model = EmbeddedVLMEngine.build(TOKENIZER, seed=5).model
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        global_batch_rollouts=1,
        micro_batch_size=1,
        clip=DEFAULT_CLIP,
        logprobs=logprobs_function(),
    )
    report = trainer.train_step(batch)
    assert report.optimizer_steps == 1 and report.diagnostics.max_token_mult_prob_error < 1.001
    vision = model.model.visual.patch_embed.proj.weight
    assert not torch.equal(vision, before[[*model.parameters()].index(vision)])


def test_an_ancestor_image_is_in_every_row_of_a_branch_and_owned_once(vlm: Gateway):
    vlm.open(selection_policy="all_captured", forest_mode=True)
    client = vlm.client()
    history = [user("look", A)]
    root = call(client, "c1", history)
    call(client, "c2", [*history, echoed(root), user("left", B)])
    right = call(client, "c3", [*history, echoed(root), user("right")])
    answer = vlm.http.post(
        "/v1/attempts/att-1/result", json={"reward": 1.0, "terminal_response_id": right.id}
    )
    assert answer.status_code == 200, answer.text
    rows = decide(vlm.state(), vlm.service.blobs, forest_training=True, max_row_tokens=None).rows
    assert [row.call_ids for row in rows] == [("c1", "c2"), ("c1", "c3")]
    assert [[(m.call_id, m.owned) for m in row.media] for row in rows] == [
        [("c1", True), ("c2", True)],
        [("c1", False)],
    ]
    assert rows[1].media[0].token_start == rows[0].media[0].token_start


def test_a_text_model_refuses_images_with_400(local_gateway: Gateway):
    local_gateway.open()
    before = local_gateway.written()
    with pytest.raises(BadRequestError) as refused:
        local_gateway.client().chat.completions.create(
            model="grove/test-tiny", messages=[user("look", A)], max_tokens=3
        )
    assert refused.value.body["code"] == "images_not_supported"
    assert "model 'grove/test-tiny'" in refused.value.body["message"]
    assert local_gateway.written() == before


def test_grove_show_draws_each_image_as_one_box_over_its_placeholders(
    example: Example, tmp_path: Path
):
    rows_of(example)
    gateway = example.gateway
    page = write_attempt_page(
        gateway.service.log.store, gateway.service.blobs, "att-1", tmp_path / "a.html"
    )
    text = page.path.read_text()
    boxes = re.findall(r'<span class="tok img" title="([^"]*)">▣ ([^<]*)</span>', text)
    assert [name for _, name in boxes] == [
        "message-0/image-0",
        "message-2/image-0",
        "message-1/image-0",
    ]
    assert "4 placeholder tokens, 1x4x4 patches" in boxes[0][0]
    assert f"id {IMAGE_ID} " not in text  # no placeholder token drawn on its own
