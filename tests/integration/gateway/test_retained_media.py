"""A continuation's retained images are verified against its parent chain, one check at a time:
each way a retained image can differ from what the chain captured is refused with 409
``retained_media_mismatch`` before the call's intent, and nothing is written (``docs/media.md``).

Call 1 sees image A (4 placeholder tokens at chain span [s, s + 4)); every test then continues
it, re-sending A, after changing one thing the check compares: the pixels the processor makes of
A (same patch grid), the chain's tokens at A's span, how many images the chain holds, or the
span its descriptor records. The last three are changes to what the service holds of call 1's
chain (its cached view), as a corrupted record would make them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from openai import ConflictError

from grove.capture.attempt_views import AttemptView

from .support import Gateway
from .test_images import IMAGE_ID, A, B, call, echoed, serve_vlm, user


@dataclass
class Captured:
    """Call ``c1`` of attempt ``att-1``, committed, and the history that continues it."""

    gateway: Gateway
    history: list[dict[str, Any]]

    @property
    def view(self) -> AttemptView:
        """The service's view of the attempt, holding call 1's chain."""
        view = self.gateway.service.views.view("att-1")
        assert "c1" in view.media and "c1" in view.chains
        return view

    def refused(self) -> str:
        """Continue call 1 with the history unchanged; the 409's message (nothing written)."""
        before = self.gateway.written()
        with pytest.raises(ConflictError) as refused:
            call(self.gateway.client(), "c2", [*self.history, user("and now?")])
        assert refused.value.status_code == 409
        body = refused.value.body
        assert body["code"] == "retained_media_mismatch"
        assert self.gateway.written() == before
        assert "c2" not in self.gateway.state().calls
        return str(body["message"])


def capture(gateway: Gateway, *urls: str) -> Captured:
    gateway.open()
    messages = [user("look", *urls)]
    first = call(gateway.client(), "c1", messages)
    return Captured(gateway, [*messages, echoed(first)])


@pytest.fixture
def captured(tmp_path: Path) -> Iterator[Captured]:
    with serve_vlm(tmp_path) as gateway:
        yield capture(gateway, A)


@pytest.fixture
def captured_two(tmp_path: Path) -> Iterator[Captured]:
    with serve_vlm(tmp_path) as gateway:
        yield capture(gateway, A, B)


def test_an_unchanged_retained_image_continues_its_call(captured: Captured):
    call(captured.gateway.client(), "c2", [*captured.history, user("and now?")])
    assert captured.gateway.state().calls["c2"].parent_call_id == "c1"


def test_same_patch_grid_with_other_pixels_is_refused_by_the_pixel_digest(captured: Captured):
    vision = captured.gateway.service.renderer.vision
    # A processor that normalizes differently: the same patch grid, other pixel values.
    vision.image_processor.image_mean = [0.25, 0.25, 0.25]
    vision._cache.clear()
    message = captured.refused()
    assert "image 0 of message 0" in message and "'c1'" in message
    assert "pixel digest" in message and "patch grid" not in message


def test_other_tokens_at_the_retained_span_are_refused(captured: Captured):
    view = captured.view
    (descriptor,) = view.media["c1"]
    chain = list(view.chains["c1"])
    assert chain[descriptor.token_start : descriptor.token_end] == [IMAGE_ID] * 4
    chain[descriptor.token_start + 1] = chain[descriptor.token_start - 1]  # a vision-start token
    view.chains["c1"] = tuple(chain)
    message = captured.refused()
    span = f"[{descriptor.token_start}, {descriptor.token_end})"
    assert f"placeholder tokens at chain span {span}" in message
    assert f"4 x token {IMAGE_ID}" in message


def test_a_chain_holding_more_images_than_retained_is_refused_not_a_server_error(
    captured: Captured,
):
    view = captured.view
    (descriptor,) = view.media["c1"]
    view.media["c1"] = (descriptor, descriptor)
    message = captured.refused()
    assert "retained image count 1, the captured image has 2" in message
    assert "image 0 of message 0" in message


def test_a_chain_holding_fewer_images_than_retained_is_refused_naming_the_extra_image(
    captured_two: Captured,
):
    view = captured_two.view
    first, _ = view.media["c1"]
    view.media["c1"] = (first,)
    message = captured_two.refused()
    assert "retained image count 2, the captured image has 1" in message
    assert "image 1 of message 0" in message


def test_a_retained_descriptor_with_a_shifted_span_is_refused(captured: Captured):
    view = captured.view
    (descriptor,) = view.media["c1"]
    start, end = descriptor.token_start + 1, descriptor.token_end + 1
    view.media["c1"] = (replace(descriptor, token_start=start, token_end=end),)
    message = captured.refused()
    assert f"placeholder tokens at chain span [{start}, {end})" in message
