"""Where an image may come from, and how large it may be (``docs/security.md``, "Images"), over
real HTTP to a gateway serving the tiny vision-language model.

An image is only the strictly decoded bytes of a ``data:image/...;base64,`` URL: text after
``base64,`` that names a file on the server (``/etc//passwd`` is valid base64) is decoded, not
opened, and refused as no image, with neither the path nor the file's content in the answer;
web addresses are refused, never fetched. ``gateway.limits.max_image_bytes`` bounds the decoded
size and ``gateway.limits.max_image_pixels`` the width x height read from the header, so a small
file that would decode into a huge image is refused before it is decoded.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.embedded_vlm import EmbeddedVLMEngine, build_vlm_renderer, build_vlm_tokenizer
from grove.capture.gateway import CAPTURE_KEY_HEADER, create_app
from grove.capture.lifecycle import CaptureService
from grove.config import load_config
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import LedgerSelector, ServerThread
from grove.storage import open_blob_store

MODEL = "grove/test-tiny-vl"
TOKENIZER = build_vlm_tokenizer()


def png_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


NOISE = png_url(
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (56, 56, 3), dtype=np.uint8))
)  # 56 x 56 pixels, about 9.5 kB of PNG


class VisionGateway:
    """A served vision-language gateway, an attempt opened on it, and what it wrote."""

    def __init__(self, service: CaptureService, http: httpx.Client) -> None:
        self.service = service
        self.http = http
        opened = http.post(
            "/v1/attempts",
            json={
                "capture_key": "att-1",
                "rollout_id": "r",
                "prompt_group": "g",
                "rollout_index": 0,
            },
        )
        assert opened.status_code == 200, opened.text
        self.headers = {CAPTURE_KEY_HEADER: "att-1"}
        token = opened.json().get("attempt_token")
        if token is not None:
            self.headers[ATTEMPT_TOKEN_HEADER] = token

    def written(self) -> tuple[int, int]:
        """(events, blobs): what a refused call must not change."""
        return self.service.log.store.count(), len(self.service.blobs.list_keys())

    def call(self, url: str) -> httpx.Response:
        """A chat call showing the image at ``url``."""
        content = [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
        return self.http.post("/v1/chat/completions", json=body, headers=self.headers)


@pytest.fixture
def vision(tmp_path: Path) -> Iterator[Callable[..., VisionGateway]]:
    """``vision(**gateway_limits_keys)``: a vision-language gateway on SQLite and local blobs
    with a configuration's ``gateway.limits``."""
    with ExitStack() as stack:

        def start(**keys: Any) -> VisionGateway:
            directory = tmp_path / f"gateway-{len(list(tmp_path.iterdir()))}"
            directory.mkdir()
            database_url = f"sqlite:///{directory / 'ledger.db'}"
            migrate.upgrade(database_url)
            store = EventStore.open(database_url)
            service = CaptureService(
                AttemptLog(store),
                open_blob_store(str(directory / "blobs")),
                build_vlm_renderer(TOKENIZER),
                EmbeddedVLMEngine.build(TOKENIZER, seed=5),
                model_fingerprint=MODEL,
            )
            overrides = {f"gateway.limits.{key}": value for key, value in keys.items()}
            limits = load_config(overrides=overrides).gateway.limits.capture()
            app = create_app(
                service,
                selector=LedgerSelector(),
                model_name=MODEL,
                limits=limits,
                on_shutdown=store.close,
            )
            server = stack.enter_context(ServerThread(app))
            http = stack.enter_context(httpx.Client(base_url=server.base_url))
            return VisionGateway(service, http)

        yield start


def refusal(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text
    error: dict[str, Any] = answer.json()["error"]
    return error


# -- where an image comes from (D7) ---------------------------------------------------------


def test_a_data_url_naming_a_server_file_is_refused_without_opening_it(
    vision: Callable[..., VisionGateway],
) -> None:
    gateway = vision()
    written = gateway.written()
    error = refusal(gateway.call("data:image/png;base64,/etc//passwd"))
    assert error["code"] == "invalid_image"
    assert "not a readable image" in error["message"]
    assert "passwd" not in error["message"] and "/etc" not in error["message"]
    assert "root:" not in error["message"]
    assert gateway.written() == written


def test_a_data_url_naming_a_relative_path_is_refused_and_its_file_never_captured(
    vision: Callable[..., VisionGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = vision()
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "pict").write_bytes(base64.b64decode(NOISE.partition(",")[2]))
    monkeypatch.chdir(tmp_path)  # "img/pict" is valid base64 and a real image file here
    written = gateway.written()
    error = refusal(gateway.call("data:image/png;base64,img/pict"))
    assert error["code"] == "invalid_image"
    assert "img/pict" not in error["message"]
    assert gateway.written() == written


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/image.png", "file:///etc/passwd", "/etc/passwd", "img/pict"]
)
def test_an_image_that_is_not_a_data_url_is_refused_and_never_fetched(
    vision: Callable[..., VisionGateway], url: str
) -> None:
    gateway = vision()
    written = gateway.written()
    error = refusal(gateway.call(url))
    assert "only inline data:image/...;base64, URLs are accepted" in error["message"]
    assert "passwd" not in error["message"] and "pict" not in error["message"]
    assert gateway.written() == written


def test_a_data_url_that_is_not_strict_base64_is_refused(
    vision: Callable[..., VisionGateway],
) -> None:
    gateway = vision()
    error = refusal(gateway.call(NOISE[:40] + "!" + NOISE[40:]))
    assert "not strict base64" in error["message"]


# -- gateway.limits.max_image_bytes ----------------------------------------------------------


def test_an_image_over_max_image_bytes_is_refused_before_it_is_decoded(
    vision: Callable[..., VisionGateway],
) -> None:
    gateway = vision(max_image_bytes=4096)
    written = gateway.written()
    error = refusal(gateway.call(NOISE))
    assert "gateway.limits.max_image_bytes" in error["message"]
    assert gateway.written() == written
    assert vision().call(NOISE).status_code == 200  # the default limit takes it


# -- gateway.limits.max_image_pixels ---------------------------------------------------------


def test_an_image_over_max_image_pixels_is_refused(vision: Callable[..., VisionGateway]) -> None:
    gateway = vision(max_image_pixels=56 * 56 - 1)
    written = gateway.written()
    error = refusal(gateway.call(NOISE))
    assert "56 x 56 = 3136 pixels" in error["message"]
    assert "gateway.limits.max_image_pixels" in error["message"]
    assert gateway.written() == written


def test_a_small_file_of_a_huge_image_is_refused_from_its_header(
    vision: Callable[..., VisionGateway],
) -> None:
    bomb = png_url(Image.new("1", (9000, 9000)))  # 81 million pixels in a few kB of PNG
    assert len(bomb) < 100_000
    error = refusal(vision().call(bomb))
    assert "9000 x 9000 = 81000000 pixels" in error["message"]
