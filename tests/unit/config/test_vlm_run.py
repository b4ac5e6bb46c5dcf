"""``model.architecture: vlm``: a ``grove train`` run on the embedded vision-language model takes
tasks with images through the gateway, captures them and trains on them exactly
(``docs/media.md``); the combinations it cannot serve are refused when the configuration loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from examples.image_agent import image_data_url
from grove.capture.embedded_vlm import EMBEDDED_VLM_NAME
from grove.config import ConfigurationError, load_config
from grove.storage import BlobRef, MediaDescriptor
from grove.train.job import run_training
from grove.workspace import Workspace
from tests.unit.config.runs import RUN_ID, Run, merged, tiny_configuration, write_tasks

IMAGES = (image_data_url(1, 56, 56), image_data_url(2, 28, 84))  # 4 and 3 placeholder tokens
TASKS = (
    {"prompt": "red", "images": [IMAGES[0]]},
    {"prompt": "green", "images": list(IMAGES)},
)  # played in file order: step 0 "red", step 1 "green"


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    directory = tmp_path_factory.mktemp("vlm")
    data = merged(
        tiny_configuration(directory),
        {
            "model": {"architecture": "vlm"},
            "data": {
                "path": str(write_tasks(directory / "image_tasks.jsonl", TASKS)),
                "shuffle": False,
            },
            "grpo": {"seq_logprob_error_threshold": 1.001},
        },
    )
    data["harness"] = {"target": "examples.image_agent:play", "options": {"follow_ups": 1}}
    config = load_config(data)
    workspace = Workspace.resolve(directory / "work")
    summary = run_training(config, workspace, run_id=RUN_ID, console=None)
    return Run(config, workspace, summary, directory)


def _geometry(media: MediaDescriptor) -> tuple[str, int, int, int]:
    return (media.media_id, media.frames, media.height, media.width)


def _stored_media(run: Run, capture_key: str) -> list[list[tuple[str, int, int, int]]]:
    """Each committed call's stored images: (media id, frames, height, width)."""
    state = run.attempt(capture_key)
    stored = []
    with run.ledger() as (_, blobs):
        for call in state.calls.values():
            c = call.committed
            delta = blobs.get_delta(BlobRef(c.blob_key, c.blob_sha256, c.blob_bytes))
            stored.append([_geometry(m.descriptor) for m in delta.media])
    return stored


def test_model_architecture_vlm_is_the_policy_the_gateway_serves_and_trains(
    vlm_run: Run,
) -> None:
    assert vlm_run.info()["model"] == EMBEDDED_VLM_NAME
    trained = load_file(Path(str(vlm_run.summary.checkpoint), "model.safetensors"))
    assert any(name.startswith("model.visual.") for name in trained)


def test_a_vlm_run_stores_each_image_once_in_the_call_that_first_sends_it(vlm_run: Run) -> None:
    # the follow-up re-sends the first call's images: they are verified, not stored again
    assert _stored_media(vlm_run, "keys-s0-g0-r0") == [[("message-0/image-0", 1, 4, 4)], []]
    assert _stored_media(vlm_run, "keys-s1-g0-r0") == [
        [("message-0/image-0", 1, 4, 4), ("message-0/image-1", 1, 2, 6)],
        [],
    ]


def test_a_vlm_run_trains_its_image_rows_with_the_generation_logprobs(vlm_run: Run) -> None:
    decisions = [vlm_run.attempt(f"keys-s{s}-g0-r{r}").finalized for s in (0, 1) for r in (0, 1)]
    assert [d.trainable for d in decisions] == [True] * 4
    assert [len(d.paths[0]) for d in decisions] == [2] * 4  # one row: the call and its follow-up
    metrics = vlm_run.metrics()
    assert len(metrics) == 2
    assert all(m["train/max_token_mult_prob_error"] < 1.001 for m in metrics)
    # grpo.seq_logprob_error_threshold recomputes with the images too: no rollout is excluded,
    # so every real row of both steps trains (two rollouts of one row each per step)
    assert [m["forest/masked_rows"] for m in metrics] == [0.0, 0.0]
    assert [m["forest/rows"] for m in metrics] == [2.0, 2.0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"policy": {"tree_packing": True}}, "policy.tree_packing: true is not supported"),
        (
            {"engine": {"kind": "vllm", "vllm_launch": True}},
            "model.architecture: vlm is served by the embedded engine only",
        ),
        ({"model": {"warm_start": True}}, "model.warm_start fits the text models"),
    ],
)
def test_model_architecture_vlm_refuses_what_cannot_serve_or_train_images(
    override: dict, message: str
) -> None:
    model = {"architecture": "vlm", **override.pop("model", {})}
    with pytest.raises(ConfigurationError, match=message):
        load_config({"model": model, **override})
