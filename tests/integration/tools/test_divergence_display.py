"""``grove lineage`` and ``grove show`` print the divergence of a root the boundary check made.

The ledger holds one attempt recorded through the capture service whose tokenizer writes
`` (turn N)`` into the system prompt of a conversation with N answers
(``tests/fixtures/templates.py``): its second call roots ``rendered_history_differs``, with the
divergence at message 0.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from grove.capture.divergence import Divergence
from grove.capture.embedded import EMBEDDED_MODEL_NAME, EmbeddedEngine
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.workspace import Workspace
from tests.fixtures.templates import turn_marking_tokenizer

from .grove_cli import run_grove

SYSTEM = {"role": "system", "content": "You count apples."}
TASK = {"role": "user", "content": "Count the apples."}
FOLLOW_UP = {"role": "user", "content": "And the pears?"}


@dataclass(frozen=True)
class Recorded:
    """The workspace and the divergence recorded on the second call's intent."""

    workspace: Workspace
    divergence: dict

    def args(self) -> tuple[str, ...]:
        workspace = self.workspace
        return ("--database-url", workspace.database_url, "--blob-url", workspace.blob_url)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    workspace = Workspace.resolve(tmp_path_factory.mktemp("divergence"))
    migrate.upgrade(workspace.database_url)
    store = EventStore.open(workspace.database_url)
    tokenizer = turn_marking_tokenizer()
    try:
        service = CaptureService(
            AttemptLog(store),
            open_blob_store(workspace.blob_url),
            Renderer(tokenizer),
            EmbeddedEngine.build(tokenizer),
            model_fingerprint=EMBEDDED_MODEL_NAME,
        )
        service.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
        options, sampling = RenderOptions(model=EMBEDDED_MODEL_NAME), SamplingParams(max_tokens=4)
        first = service.generate("att-1", ModelCall([SYSTEM, TASK], options, sampling, "c1"))
        request = [SYSTEM, TASK, first.message, FOLLOW_UP]
        service.generate("att-1", ModelCall(request, options, sampling, "c2"))
        divergence = service.log.load("att-1").calls["c2"].intended.admission["divergence"]
    finally:
        store.close()
    return Recorded(workspace, divergence)


def test_lineage_json_carries_each_roots_recorded_divergence(recorded: Recorded):
    outcome = run_grove("lineage", "att-1", "--json", *recorded.args())
    assert outcome.code == 0, outcome.stderr
    (attempt,) = json.loads(outcome.stdout)["attempts"]
    calls = {c["call_id"]: c for c in attempt["calls"]}
    assert calls["c2"]["root_reason"] == "rendered_history_differs"
    assert calls["c2"]["divergence"] == recorded.divergence
    assert calls["c1"]["divergence"] is None


def test_lineage_prints_the_divergence_under_its_root(recorded: Recorded):
    outcome = run_grove("lineage", "att-1", *recorded.args())
    assert outcome.code == 0, outcome.stderr
    printed = " ".join(outcome.stdout.split())  # the tree wraps long lines
    assert "c2 root (rendered_history_differs)" in printed
    at = len("<|im_start|>system\nYou count apples.")
    assert f"diverged at message 0, character {at}" in printed
    assert "likely cause: changed content" in printed
    assert "parent (the parent chain's exact tokens)" in printed
    assert "request (the history rendered, outputs as their exact text)" in printed


def test_show_writes_the_divergence_of_each_root_on_the_page(recorded: Recorded, tmp_path: Path):
    page = tmp_path / "attempt.html"
    outcome = run_grove("show", "att-1", "--html", str(page), *recorded.args())
    assert outcome.code == 0, outcome.stderr
    written = page.read_text(encoding="utf-8")
    described = html.escape(Divergence.from_payload(recorded.divergence).describe())
    assert "<h2>Divergences</h2>" in written
    assert (
        '<section class="divergence" data-call="c2"><h3>c2: root (rendered_history_differs)</h3>'
        f"<pre>{described}</pre></section>"
    ) in written
    assert written.count(described) == 2  # and in the c2 node's tooltip
