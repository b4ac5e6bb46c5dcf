"""``grove serve --architecture vlm`` serves the embedded vision-language model: it takes images
through the official ``openai`` client and captures them (``docs/media.md``). A text model's
refusal of images is in ``test_images.py``."""

from __future__ import annotations

from pathlib import Path

import httpx
from openai import OpenAI

from examples.image_agent import image_data_url, image_message
from grove.capture.embedded_vlm import EMBEDDED_VLM_NAME
from grove.client import ATTEMPT_TOKEN_HEADER, CAPTURE_KEY_HEADER
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import BlobRef, open_blob_store

from .test_cli_serve import grove_serve

IMAGE = image_data_url(1, 56, 56)  # a 4 x 4 patch grid: 4 placeholder tokens


def test_grove_serve_architecture_vlm_takes_an_image_and_stores_it(tmp_path: Path) -> None:
    with grove_serve(tmp_path, "--architecture", "vlm") as base_url:
        opened = {"capture_key": "att-1", "rollout_id": "r1", "prompt_group": "g"}
        answer = httpx.post(f"{base_url}/v1/attempts", json={**opened, "rollout_index": 0})
        answer.raise_for_status()
        client = OpenAI(
            base_url=f"{base_url}/v1",
            api_key="unused",
            default_headers={
                CAPTURE_KEY_HEADER: "att-1",
                ATTEMPT_TOKEN_HEADER: answer.json()["attempt_token"],
            },
        )
        assert [m.id for m in client.models.list().data] == [EMBEDDED_VLM_NAME]
        completion = client.chat.completions.create(
            model=EMBEDDED_VLM_NAME,
            messages=[image_message("what is this?", [IMAGE])],
            max_tokens=3,
        )
    assert completion.usage is not None
    store = EventStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        (call,) = AttemptLog(store).load("att-1").calls.values()
    finally:
        store.close()
    committed = call.committed
    assert committed is not None
    blobs = open_blob_store(str(tmp_path / "blobs"))
    delta = blobs.get_delta(
        BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    )
    (media,) = delta.media
    descriptor = media.descriptor
    assert (descriptor.media_id, descriptor.frames, descriptor.height, descriptor.width) == (
        "message-0/image-0",
        1,
        4,
        4,
    )
    assert descriptor.token_end - descriptor.token_start == 4
