"""``grove show --html``: one self-contained page with a demo attempt's capture graph and rows.

The page is checked here as written; ``tests/browser`` loads it in headless Chromium.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from grove.tools.lineage import AttemptLineage, CallLineage
from grove.tools.show import render_page
from grove.training.forest import CallRecord, build_forest

from .grove_cli import run_grove
from .ledgers import DemoLedger, written_page
from .page_dom import PageDom

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


@pytest.fixture(scope="module")
def page(demo: DemoLedger, tmp_path_factory: pytest.TempPathFactory) -> PageDom:
    path = written_page(demo, tmp_path_factory.mktemp("show") / "attempt.html")
    return PageDom(path.read_text(encoding="utf-8"))


def test_show_draws_every_call_as_a_graph_node_marked_by_its_fate(demo: DemoLedger, page):
    state = demo.state(demo.showcase_key)
    selected = set(state.selection.call_ids)
    endpoints = {path[-1] for path in state.finalized.paths}
    assert list(page.nodes) == list(state.calls)
    for call in state.calls.values():
        classes = page.nodes[call.call_id]
        assert call.intended.decision in classes
        assert ("is-selected" in classes) == (call.call_id in selected)
        assert ("endpoint" in classes) == (call.call_id in endpoints)
        rejected = call.failure is not None and call.failure.reason == "rejected_by_harness"
        if rejected:
            assert "rejected" in classes


def test_show_writes_each_row_with_context_and_loss_tokens(demo: DemoLedger, page):
    state = demo.state(demo.showcase_key)
    finalized = state.finalized
    assert [(r.index, r.call_ids) for r in page.rows] == [
        (i, list(path)) for i, path in enumerate(finalized.paths)
    ]
    for row, owned in zip(page.rows, finalized.owned, strict=True):
        calls = [state.calls[c].committed for c in row.call_ids]
        generated = sum(c.generated_len for c in calls)
        assert len(row.tokens) == calls[-1].cum_len
        loss = [t for k, t in row.tokens if k == "loss"]
        unowned = [t for k, t in row.tokens if k == "unowned"]
        owned_generated = sum(state.calls[c].committed.generated_len for c in owned)
        assert (len(loss), len(unowned)) == (owned_generated, generated - owned_generated)
        assert all("logprob -" in title or "logprob 0" in title for title in loss)


def test_show_titles_each_token_with_its_decoded_text_and_id(page):
    kind, title = page.rows[0].tokens[0]
    assert kind == "ctx"
    assert title.startswith("#0 id ") and "'<|im_start|>'" in title


def test_show_page_is_self_contained(page):
    assert page.fetches == []
    assert page.svg_ids == ["graph"]


def test_show_to_a_missing_directory_fails_and_writes_nothing(demo: DemoLedger, tmp_path: Path):
    target = tmp_path / "missing" / "attempt.html"
    outcome = run_grove(
        "show", demo.showcase_key, "--html", str(target), "--workdir", str(demo.workspace.workdir)
    )
    assert outcome.code == 2
    assert f"Invalid value for --html: directory {target.parent} does not exist" in outcome.stderr
    assert not target.parent.exists()


def test_show_of_an_unknown_key_fails_and_writes_nothing(demo: DemoLedger, tmp_path: Path):
    target = tmp_path / "attempt.html"
    outcome = run_grove(
        "show", "no-such-attempt", "--html", str(target), "--workdir", str(demo.workspace.workdir)
    )
    assert outcome.code == 1
    assert "no attempt has this capture key or rollout id" in " ".join(outcome.stderr.split())
    assert not target.exists()


def _call(call_id: str, parent: str | None, index: int, rows: tuple[int, ...]) -> CallLineage:
    return CallLineage(
        call_id=call_id, parent_call_id=parent, root_call_id="a", depth=0 if parent is None else 1,
        decision="continuation" if parent else "root", root_reason=None if parent else "first_call",
        status="committed", late=False, failure_reason=None, selection_index=index,
        endpoint=parent is not None, terminal=call_id == "c", rows=rows, owner_row=rows[0],
        masked_reason=None, prompt_tokens=2, prev_len=0, delta_len=4, cum_len=4, generated_len=2,
        finish_reason="stop", response_id=f"resp-{call_id}",
    )  # fmt: skip


def test_a_branch_shows_the_shared_ancestors_generation_as_unowned_in_the_later_row():
    # a (prompt 1 2, generates 3 4) has two selected children: b (5 | 6) and c (7 | 8).
    # Row 0 = a b owns a's 3 4 and b's 6; row 1 = a c carries 3 4 unowned and owns c's 8.
    records = [
        CallRecord("a", None, [1, 2], [3, 4], [-0.5, -0.25]),
        CallRecord("b", "a", [5], [6], [-1.0]),
        CallRecord("c", "a", [7], [8], [-2.0]),
    ]
    forest = build_forest(records, ["a", "b", "c"], terminal="c")
    calls = (_call("a", None, 0, (0, 1)), _call("b", "a", 1, (0,)), _call("c", "a", 2, (1,)))
    lineage = AttemptLineage(
        capture_key="att-1", rollout_id="r0", prompt_group="g0", rollout_index=0,
        selection_policy="returned_history", admissions_closed=True, settled=True,
        settle_timed_out=False, cleaned=False, rollout=None,
        paths=(("a", "b"), ("a", "c")), owned=(("a", "b"), ("c",)), calls=calls,
    )  # fmt: skip
    page = PageDom(render_page(lineage, forest, lambda token: f"t{token}"))
    kinds = [[kind for kind, _ in row.tokens] for row in page.rows]
    assert kinds == [
        ["ctx", "ctx", "loss", "loss", "ctx", "loss"],
        ["ctx", "ctx", "unowned", "unowned", "ctx", "loss"],
    ]
    assert page.rows[1].tokens[2][1] == (
        "#2 id 3 't3'\na: generated, owned by an earlier row (context here)"
    )
    assert page.rows[1].tokens[5][1] == "#5 id 8 't8'\nc: generated, loss here, logprob -2.0000"


def test_the_graph_tells_selected_rejected_failed_pending_and_late_calls_apart():
    calls = (
        _call("a", None, 0, (0,)),
        replace(_call("r", "a", 0, (0,)), selection_index=None, rows=(), owner_row=None),
        replace(_call("f", "a", 0, (0,)), status="failed", selection_index=None, rows=()),
        replace(_call("p", "a", 0, (0,)), status="pending", selection_index=None, rows=()),
        replace(_call("l", "a", 0, (0,)), late=True, selection_index=None, rows=()),
    )
    lineage = AttemptLineage(
        capture_key="att-1", rollout_id="r0", prompt_group="g0", rollout_index=0,
        selection_policy="returned_history", admissions_closed=True, settled=True,
        settle_timed_out=True, cleaned=False, rollout=None, paths=(), owned=(), calls=calls,
    )  # fmt: skip
    page = PageDom(render_page(lineage, None, None, "no rows"))
    fates = {call_id: classes & {"selected", "rejected", "failed", "pending"}
             for call_id, classes in page.nodes.items()}  # fmt: skip
    assert fates == {
        "a": {"selected"},
        "r": {"rejected"},
        "f": {"failed"},
        "p": {"pending"},
        "l": {"pending"},
    }
    assert page.rows == []
