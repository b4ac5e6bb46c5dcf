"""Normalization version 4: an image sent as a Chat ``image_url`` part and as a Responses
``input_image`` part is one normalized item, so its digests agree (``docs/normalization.md``)."""

from __future__ import annotations

from grove.capture.render import admission_items, normalize_messages

URL = "data:image/png;base64,iVBORw0KGgo="


def _chat(detail: str | None = None) -> dict:
    image = {"url": URL} if detail is None else {"url": URL, "detail": detail}
    return {
        "role": "user",
        "content": [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": image}],
    }


def _responses(detail: str = "auto") -> dict:
    return {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "what?"},
            {"type": "input_image", "image_url": URL, "detail": detail},
        ],
    }


def test_chat_and_responses_images_normalize_to_one_chat_form() -> None:
    (message,) = normalize_messages([_responses()]).messages
    assert message == {
        "role": "user",
        "content": [
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": URL}},
        ],
    }
    assert normalize_messages([_chat()]).messages == (message,)


def test_chat_and_responses_images_have_the_same_item_digest() -> None:
    chat = admission_items(normalize_messages([_chat("auto")]))
    responses = admission_items(normalize_messages([_responses("auto")]))
    assert chat == responses


def test_an_image_detail_other_than_auto_is_kept_and_tells_images_apart() -> None:
    (low,) = normalize_messages([_responses("low")]).messages
    assert low["content"][1] == {"type": "image_url", "image_url": {"url": URL, "detail": "low"}}
    assert normalize_messages([_chat("low")]).messages == (low,)
    assert normalize_messages([_chat("high")]).messages != (low,)
