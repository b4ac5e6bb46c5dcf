"""``model.architecture: moe``: a ``grove train`` run on the embedded MoE model captures every
call's routed experts and trains with them replayed (``docs/moe.md``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from grove.capture.embedded import EMBEDDED_MODEL_NAME, build_tokenizer
from grove.capture.embedded_moe import EMBEDDED_MOE_MODEL_NAME, build_moe_model
from grove.engines.models import load_model
from grove.storage import BlobRef
from grove.tools.export import export_from_run
from grove.train.preflight import ModelCheckError, check_policy_model
from tests.unit.config.runs import Run, train

THREE_CALLS = {"harness": {"options": {"calls": 3}}}  # continuations: rows of three segments


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return train(tmp_path_factory.mktemp("moe"), {"model": {"architecture": "moe"}}, THREE_CALLS)


def _blob_routes(run: Run, capture_key: str) -> list[tuple[int, ...] | None]:
    """The shape of each committed call's stored routes (None: no routes)."""
    state = run.attempt(capture_key)
    shapes = []
    with run.ledger() as (_, blobs):
        for call in state.calls.values():
            c = call.committed
            delta = blobs.get_delta(BlobRef(c.blob_key, c.blob_sha256, c.blob_bytes))
            shapes.append(None if delta.routes is None else tuple(delta.routes.shape))
    return shapes


def test_model_architecture_moe_is_the_policy_the_gateway_serves_and_trains(
    moe_run: Run, base_run: Run
) -> None:
    assert [p["model"] for p in moe_run.played()] == [EMBEDDED_MOE_MODEL_NAME] * 4
    trained = load_file(Path(str(moe_run.summary.checkpoint), "model.safetensors"))
    assert "model.layers.1.mlp.experts.gate_up_proj" in trained
    assert [p["model"] for p in base_run.played()] == [EMBEDDED_MODEL_NAME] * 4


def test_every_call_of_an_moe_run_stores_its_routes_per_layer(moe_run: Run, base_run: Run) -> None:
    state = moe_run.attempt("keys-s0-g0-r0")
    lengths = [c.committed.delta_len for c in state.calls.values()]
    assert _blob_routes(moe_run, "keys-s0-g0-r0") == [(n, 2, 2) for n in lengths]
    assert _blob_routes(base_run, "keys-s0-g0-r0") == [None]


def test_an_moe_run_trains_its_three_call_rows_with_replayed_routes(moe_run: Run) -> None:
    decisions = [moe_run.attempt(f"keys-s{s}-g0-r{r}") for s in (0, 1) for r in (0, 1)]
    assert [d.finalized.trainable for d in decisions] == [True] * 4
    assert [len(d.finalized.paths[0]) for d in decisions] == [3] * 4  # one row, three calls
    # the learner computes what the engine sampled: replay leaves rounding alone
    assert all(m["train/max_token_mult_prob_error"] < 1.001 for m in moe_run.metrics())


def test_an_moe_model_with_a_capacity_limit_is_refused_before_any_rollout(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    model = build_moe_model(tokenizer, seed=0, hidden_size=16, num_layers=1)
    model.config.capacity_factor = 1.25
    model.save_pretrained(tmp_path / "capped")
    tokenizer.save_pretrained(tmp_path / "capped")

    with pytest.raises(ModelCheckError, match=r"config\.capacity_factor is 1\.25: a capacity"):
        train(tmp_path / "run", {"model": {"path": str(tmp_path / "capped")}})

    assert not (tmp_path / "run" / "harness.jsonl").exists()  # no rollout was played


def test_an_moe_runs_checkpoint_exports_as_a_directory_that_passes_the_setup_check(
    moe_run: Run, tmp_path: Path
) -> None:
    out = export_from_run(Path(str(moe_run.summary.checkpoint)), tmp_path / "hf")

    loaded = load_model(str(out))
    assert type(loaded.model).__name__ == "Qwen2MoeForCausalLM"
    check_policy_model(loaded.model, loaded.name, engine_kind="embedded")  # passes
