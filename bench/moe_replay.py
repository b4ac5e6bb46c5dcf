"""Router replay on the embedded MoE model: TMPE with and without replay on the same batch, and
what capture and replay cost beside their baselines.

Usage: ``python -m bench.moe_replay [--quick] [--json]``

Rollouts are captured through the real capture path (``CaptureService``: render, splice, the
embedded engine sampling in float32, delta blobs in a local store, a SQLite ledger), three calls
each with the context rewritten after the first, and projected into one step's batch
(``Projector``). On that one batch the learner computes every owned token's logprob twice with
the sampling weights: with the captured routes replayed (``grove.training.route_replay``) and with
its routers choosing anew (``grove.training.trainer.row_logprobs``). Reported: max and mean TMPE of
each.

Two models: ``near_tie`` (experts 0 and 1 of every layer one float32 ulp apart, so rounding
decides between them, as happens at near-ties in any MoE) is the headline; ``as_drawn`` (the
seeded routers as drawn) shows that a tiny random model rarely meets a tie at all.

Costs, as ratios measured in the same run: a generation that records its routes (hooks, one
extra decode step for the final token) over the same generation unrecorded; a replayed forward
and backward over the plain one on the same rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.embedded_moe import build_moe_model
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import RolloutSelected
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.training.projector import Projector, ProjectorSettings, captured_calls
from grove.training.route_replay import replayed_row_logprobs
from grove.training.selection import select_rollout
from grove.training.trainer import StepBatch, row_logprobs

OPTIONS = RenderOptions(model="grove-tiny-moe")


def capture_batch(model: torch.nn.Module, rollouts: int, max_tokens: int, work: Path) -> StepBatch:
    """``rollouts`` rollouts of one prompt group captured and projected into one step."""
    tokenizer = build_tokenizer()
    url = f"sqlite:///{work / 'ledger.db'}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    blobs = open_blob_store(str(work / "blobs"))
    engine = EmbeddedEngine(model, stop_token_ids=[tokenizer.eos_token_id], seed=3)
    capture = CaptureService(
        AttemptLog(store), blobs, Renderer(tokenizer), engine, model_fingerprint=OPTIONS.model
    )
    sampling = SamplingParams(max_tokens=max_tokens)
    try:
        for index in range(rollouts):
            key = f"g0-r{index}"
            capture.open_attempt(key, rollout_id=key, prompt_group="g0", rollout_index=index)
            messages = [{"role": "user", "content": f"Task {index}: find the weather."}]
            returned = list(messages)
            for turn in range(3):
                if turn == 1:
                    messages = [{"role": "user", "content": f"Summary of task {index} so far."}]
                outcome = capture.generate(key, ModelCall(messages, OPTIONS, sampling, f"c{turn}"))
                observation = {"role": "tool", "content": f"sunny, {20 + turn} degrees"}
                messages = [*messages, outcome.message, observation]
                returned += [{**outcome.message, "response_id": outcome.response_id}, observation]
            state = capture.settle(key, timeout_s=0.2)
            chosen = select_rollout(
                "returned_history", captured_calls(state), {"output": returned, "reward": 1.0}
            )
            capture.select(
                key,
                RolloutSelected(
                    policy=chosen.policy,
                    call_ids=chosen.call_ids,
                    terminal_response_id=chosen.terminal_response_id,
                    reward=chosen.reward,
                ),
            )
        projector = Projector(
            store, blobs, ProjectorSettings(rollouts_per_group=rollouts, groups_per_step=1)
        )
        projector.poll()
        published = projector.batch_for_step(0)
        if published is None:
            raise RuntimeError("the step's prompt group did not complete")
        batch = published.batch
    finally:
        store.close()
    return StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=torch.zeros(batch.num_rows),
        owners=batch.parent_indices,
        logical_rollouts=batch.num_rollouts,
        routes=batch.routes,
    )


def tmpe(model: torch.nn.Module, batch: StepBatch, logprobs: Callable[..., Any]) -> dict[str, Any]:
    """Max and mean TMPE over the owned generated tokens, and how many exceed 1.001."""
    with torch.no_grad():
        trainer = logprobs(model, batch, slice(None))
    error = torch.exp((trainer.double() - batch.generation_logprobs.double()).abs())
    owned = error[batch.loss_mask]
    return {
        "max_tmpe": float(owned.max()),
        "mean_tmpe": float(owned.mean()),
        "tokens_over_1_001": int((owned > 1.001).sum()),
        "tokens": int(owned.numel()),
    }


def median_s(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def costs(model: torch.nn.Module, batch: StepBatch, repeats: int) -> dict[str, float]:
    """Recorded over unrecorded generation; replayed over plain forward and backward."""
    tokenizer = build_tokenizer()
    prompt = tokenizer.encode("<|im_start|>user\nThe quick brown fox<|im_end|>\n")
    sampling = SamplingParams(max_tokens=32, seed=1)
    recorded = EmbeddedEngine(model, stop_token_ids=[], seed=0)
    plain = EmbeddedEngine(model, stop_token_ids=[], seed=0)
    plain._routers = []  # the baseline: the same engine, recording nothing
    generate_recorded = median_s(lambda: recorded.generate(prompt, sampling), repeats)
    generate_plain = median_s(lambda: plain.generate(prompt, sampling), repeats)

    def step(logprobs: Callable[..., torch.Tensor]) -> None:
        model.zero_grad(set_to_none=True)
        (logprobs(model, batch, slice(None)) * batch.loss_mask).sum().backward()

    train_replayed = median_s(lambda: step(replayed_row_logprobs), repeats)
    train_plain = median_s(lambda: step(row_logprobs), repeats)
    model.zero_grad(set_to_none=True)
    return {
        "generate_recorded_over_plain": generate_recorded / generate_plain,
        "forward_backward_replayed_over_plain": train_replayed / train_plain,
        "generate_plain_ms": generate_plain * 1e3,
        "forward_backward_plain_ms": train_plain * 1e3,
    }


def run(rollouts: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    """TMPE with and without replay on the near-tie and the as-drawn model, and the costs."""
    tokenizer = build_tokenizer()
    results: dict[str, Any] = {"rollouts": rollouts, "max_tokens": max_tokens}
    for name, near_tie in (("near_tie", 1e-7), ("as_drawn", None)):
        model = build_moe_model(tokenizer, seed=0, near_tie=near_tie)
        with tempfile.TemporaryDirectory() as work:
            batch = capture_batch(model, rollouts, max_tokens, Path(work))
        results[name] = {
            "rows": int(batch.token_ids.shape[0]),
            "replayed": tmpe(model, batch, replayed_row_logprobs),
            "routed_anew": tmpe(model, batch, row_logprobs),
        }
        if name == "near_tie":
            results["costs"] = costs(model, batch, repeats)
    return results


def main() -> None:
    """Run the benchmark; print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and repeats")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = run(*((4, 16, 3) if args.quick else (8, 32, 7)))
    if args.json:
        print(json.dumps(results))
        return
    for name in ("near_tie", "as_drawn"):
        entry = results[name]
        for side in ("replayed", "routed_anew"):
            r = entry[side]
            print(
                f"{name:9s} {side:11s} max TMPE {r['max_tmpe']:.7f}  mean {r['mean_tmpe']:.7f}  "
                f"tokens > 1.001: {r['tokens_over_1_001']} of {r['tokens']} ({entry['rows']} rows)"
            )
    for key, value in results["costs"].items():
        print(f"{key}: {value:.3f}")


if __name__ == "__main__":
    main()
