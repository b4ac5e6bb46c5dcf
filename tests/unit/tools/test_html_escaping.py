"""The HTML pages write what they show as text: ``grove show --html`` and ``grove report`` escape
every value that comes from a ledger or a run (a model directory, a capture key, a call id, a
reason, a metric name), so a name such as ``<img src=x onerror=alert(1)>`` is never a live tag.
"""

from __future__ import annotations

from grove.tools.lineage import AttemptLineage, CallLineage
from grove.tools.report import render_report
from grove.tools.show import render_page
from grove.train.run_log import StepRecord
from grove.training.forest import CallRecord, build_forest

HOSTILE = "<img src=x onerror=alert(1)>"
ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"


def hostile_call(call_id: str, parent: str | None) -> CallLineage:
    return CallLineage(
        call_id=call_id, parent_call_id=parent, root_call_id="a" + HOSTILE, depth=0,
        decision="root" + HOSTILE, root_reason="first_call" + HOSTILE, status="committed",
        late=False, failure_reason="why" + HOSTILE, selection_index=0, endpoint=True,
        terminal=True, rows=(0,), owner_row=0, masked_reason="masked" + HOSTILE, prompt_tokens=1,
        prev_len=0, delta_len=2, cum_len=2, generated_len=1, finish_reason="stop" + HOSTILE,
        response_id="resp" + HOSTILE,
    )  # fmt: skip


def lineage(*calls: CallLineage) -> AttemptLineage:
    return AttemptLineage(
        capture_key="att" + HOSTILE, rollout_id="r" + HOSTILE, prompt_group="g" + HOSTILE,
        rollout_index=0, selection_policy="p" + HOSTILE, admissions_closed=True, settled=True,
        settle_timed_out=False, cleaned=False,
        rollout={"reward": 1.0, "status": "masked" + HOSTILE, "masked_reason": HOSTILE,
                 "step": None},
        paths=(), owned=(), calls=calls,
    )  # fmt: skip


def test_a_masked_rollouts_note_naming_a_hostile_model_directory_is_escaped() -> None:
    # D8: the note after "masked: ..." was written unescaped
    records = [CallRecord("a", None, [1], [2], [-0.1]), CallRecord("b", "a", [3], [4], [-0.2])]
    forest = build_forest(records, ["b"], terminal="b")  # b without its parent: masked
    assert not forest.trainable
    note = f"rows rebuilt from the blobs (model {HOSTILE}: tokens shown as ids)"
    page = render_page(lineage(), forest, None, note)
    assert "<img" not in page
    assert f"(model {ESCAPED}: tokens shown as ids)" in page


def test_every_value_of_an_attempt_page_is_escaped() -> None:
    records = [CallRecord("a" + HOSTILE, None, [1], [2], [-0.1])]
    forest = build_forest(records, ["a" + HOSTILE], terminal="a" + HOSTILE)
    calls = (hostile_call("a" + HOSTILE, None),)
    for shown in (forest, None):
        page = render_page(lineage(*calls), shown, lambda token: HOSTILE, "note" + HOSTILE)
        assert "<img" not in page
        assert ESCAPED in page


def test_every_value_of_a_run_report_is_escaped() -> None:
    records = [
        StepRecord(step=step, wall_time=1e9 + step, metrics={f"loss/{HOSTILE}": 0.5, HOSTILE: 1.0})
        for step in (1, 2)
    ]
    page = render_report("run" + HOSTILE, records, "from " + HOSTILE)
    assert "<img" not in page
    assert ESCAPED in page
