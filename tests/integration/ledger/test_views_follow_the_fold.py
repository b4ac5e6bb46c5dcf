"""The lineage views equal the attempt fold, for any sequence of events, contradictions included.

Random sequences of lifecycle events (opens, of forks too, intents, commits and failures of a few
calls with any parents, in the attempt or in a fork's source, closes, settles, selections,
finalizations and cleanings, in any order and any number of times) are appended to two attempts,
one to three events per append, each append folded by itself or left to ``catch_up`` (a writer from
before inline folding); the views must then show exactly what ``fold_attempt`` makes of each
stream, on SQLite and on PostgreSQL, and ``grove.ledger.fold_drift.fold_drift``
(``grove db check``) must find no drift in either attempt.
"""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from grove.ledger.attempt import AttemptState, fold_attempt
from grove.ledger.catch_up import catch_up
from grove.ledger.database import open_engine
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptCleaned,
    AttemptSettled,
    CallFailed,
    Event,
    ForkSource,
    RolloutFinalized,
    RolloutSelected,
    SourceCall,
)
from grove.ledger.fold_drift import fold_drift, folded_rows
from grove.ledger.store import EventStore

from .scenario import SUMMARY, committed, digest, intended, opened

CALLS = ("c1", "c2", "c3")
parents = st.sampled_from((None, *CALLS))
# A fork's source, call c9 of attempt src (the fold checks neither exists).
FORK_FROM = ForkSource(
    source_capture_key="src",
    source_call_id="c9",
    source_chain_digest=digest("chain"),
    source_cum_len=8,
    source_replay_summary=SUMMARY,
    chain=(
        SourceCall(
            capture_key="src",
            call_id="c9",
            blob_key="staging/src/c9",
            blob_sha256=digest("c9"),
            blob_bytes=100,
            chain_digest=digest("chain"),
            finish_reason="stop",
            response_id="resp-c9",
            output_fingerprint=digest("out"),
        ),
    ),
)
sources = st.sampled_from((None, "src"))


def _event(kind: str, data: st.DataObject, key: str) -> Event:
    call = data.draw(st.sampled_from(CALLS))
    if kind == "open":
        group = data.draw(st.sampled_from(("g1", "g2")))
        fork_from = data.draw(st.sampled_from((None, FORK_FROM)))
        return opened(key, rollout_id=f"{key}-r", group=group, fork_from=fork_from)
    if kind == "intend":
        parent = data.draw(parents)
        return intended(
            call,
            parent=parent,
            source=parent and data.draw(sources),
            policy_version=data.draw(st.integers(0, 3)),
        )
    if kind == "commit":
        parent = data.draw(parents)
        return committed(key, call, parent=parent, source=parent and data.draw(sources))
    if kind == "fail":
        return CallFailed(call_id=call, reason=data.draw(st.sampled_from(("engine_error", "x"))))
    if kind == "close":
        return AdmissionsClosed()
    if kind == "settle":
        return AttemptSettled(timed_out=data.draw(st.booleans()))
    if kind == "select":
        chosen = data.draw(st.lists(st.sampled_from(CALLS), max_size=3))
        return RolloutSelected(
            policy="returned_history",
            call_ids=tuple(chosen),
            reward=data.draw(st.sampled_from((0.0, 1.0))),
        )
    if kind == "finalize":
        trainable = data.draw(st.booleans())
        return RolloutFinalized(
            rollout_id=f"{key}-r",
            trainable=trainable,
            masked_reason=None if trainable else "ledger_contradiction",
            paths=(("c1",),) if trainable else (),
        )
    return AttemptCleaned(keys=(f"staging/{key}/c1",))


KINDS = ("open", "intend", "commit", "fail", "close", "settle", "select", "finalize", "clean")
# Opens and intents first more often, so that most sequences reach commits and selections.
kinds = st.one_of(
    st.sampled_from(("open", "intend", "commit", "intend", "commit")), st.sampled_from(KINDS)
)


def _expected(state: AttemptState) -> dict[str, object]:
    """What the views should show of one folded attempt: the fold's rows
    (``grove.ledger.fold_drift.folded_rows``, which ``grove db check`` compares with the tables)
    but the attempt's own row, which no view shows whole."""
    rows = folded_rows(state)
    return {name: rows[name] for name in ("calls", "rollouts", "contradictions")}


def _shown(store: EventStore, key: str) -> dict[str, object]:
    """What the views show of one attempt."""
    with store.engine.connect() as conn:
        calls = {
            (r.call_id, r.parent_call_id, r.status, bool(r.late), r.failure_reason, *r[-3:])
            for r in conn.execute(
                text(
                    "SELECT *, selection_index, policy_version, source_capture_key "
                    "FROM grove_calls WHERE capture_key = :k"
                ),
                {"k": key},
            )
        }
        row = conn.execute(
            text("SELECT * FROM grove_rollouts WHERE capture_key = :k"), {"k": key}
        ).first()
        contradictions = list(
            conn.execute(
                text(
                    "SELECT contradiction FROM grove_contradictions WHERE capture_key = :k "
                    "ORDER BY stream_version"
                ),
                {"k": key},
            ).scalars()
        )
    rollout = row and (row.rollout_id, row.status, row.selected_calls, row.reward, row.rows)
    if row is not None:
        assert row.contradictions == len(contradictions)
    return {"calls": calls, "rollouts": rollout, "contradictions": contradictions}


@settings(
    max_examples=60,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_views_equal_the_fold_of_any_event_sequence(ledger_url: str, data: st.DataObject):
    run = uuid.uuid4().hex[:8]  # examples share the database: each uses its own attempts
    keys = (f"a-{run}", f"b-{run}")
    inline = EventStore.open(ledger_url)
    legacy = EventStore(open_engine(ledger_url), project_inline=False)
    appended: dict[str, list[Event]] = {key: [] for key in keys}
    try:
        for _ in range(data.draw(st.integers(1, 16), label="appends")):
            key = data.draw(st.sampled_from(keys))
            size = data.draw(st.sampled_from((1, 1, 1, 2, 3)), label="events in the append")
            events = [_event(data.draw(kinds, label="kind"), data, key) for _ in range(size)]
            writer = inline if data.draw(st.integers(0, 4)) else legacy
            writer.append(key, events)
            appended[key].extend(events)
        catch_up(inline)
        for key in keys:
            assert _shown(inline, key) == _expected(fold_attempt(key, appended[key]))
        assert [d for d in fold_drift(inline) if d.capture_key in keys] == []
    finally:
        inline.close()
        legacy.close()
