"""A short walkthrough of the capture ledger on the embedded defaults.

One attempt of a small agent on the embedded model: three chained calls, a context rewrite that
starts a new root, a rejected response and its retry. Every call is recorded in the ledger with its
exact tokens in the blob store; the lineage views then show the capture graph.
"""

from __future__ import annotations

import uuid
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.catch_up import catch_up
from grove.ledger.events import RolloutSelected
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.workspace import Workspace

__all__ = ["run_walkthrough"]

LINEAGE = text(
    "SELECT call_id, parent_call_id, decision, root_reason, status, failure_reason, selected, "
    "cum_len FROM grove_calls WHERE capture_key = :key ORDER BY intended_position"
)


def run_walkthrough(workspace: Workspace, console: Console | None = None) -> dict[str, Any]:
    """Record one small attempt and return a summary (printing its lineage to ``console``)."""
    migrate.require_current(workspace.database_url, create_embedded=True)
    store = EventStore.open(workspace.database_url)
    tokenizer = build_tokenizer()
    service = CaptureService(
        AttemptLog(store),
        open_blob_store(workspace.blob_url),
        Renderer(tokenizer),
        EmbeddedEngine.build(tokenizer, seed=0),
        model_fingerprint="grove-tiny",
    )
    key = f"walkthrough-{uuid.uuid4().hex[:8]}"
    service.open_attempt(key, rollout_id=f"{key}-r0", prompt_group="walkthrough", rollout_index=0)
    options, sampling = RenderOptions(model="grove-tiny"), SamplingParams(max_tokens=8, seed=1)

    def call(messages: list[dict], call_id: str) -> dict:
        return service.generate(key, ModelCall(messages, options, sampling, call_id)).message

    messages = [{"role": "user", "content": "Find the key. Say LOOK to search."}]
    for turn in range(3):
        messages += [call(messages, f"c{turn + 1}"), {"role": "tool", "content": f"room {turn}"}]
    rewritten = [{"role": "user", "content": "Summary: rooms 0-2 searched, no key. Continue."}]
    call(rewritten, "c4")
    service.fail(key, "c4", "rejected_by_harness")
    call(rewritten, "c5")
    service.settle(key, timeout_s=5)
    service.select(
        key,
        RolloutSelected(policy="returned_history", call_ids=("c1", "c2", "c3", "c5"), reward=1.0),
    )
    catch_up(store)
    with store.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(LINEAGE, {"key": key})]
    store.close()
    if console is not None:
        table = Table(title=f"attempt {key}: the capture graph")
        for column in rows[0]:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        console.print(table)
        console.print(f"ledger: {workspace.database_url}   blobs: {workspace.blob_url}")
    return {
        "capture_key": key,
        "calls": len(rows),
        "roots": sum(r["decision"] == "root" for r in rows),
        "selected": sum(bool(r["selected"]) for r in rows),
    }
