"""Lineage views over the projection tables, the same SQL on SQLite and PostgreSQL.

``grove_calls``: one row per call with its attempt's rollout identity, status, selection,
policy version (the committed call's, else the intended one's) and ``source_capture_key``, the
attempt that owns its parent when that is not its own (a fork's call continuing the fork source).
``grove_call_lineage``: each call with itself (depth 0) and every ancestor (depth 1 = its parent),
each ancestor named by ``ancestor_capture_key`` and ``ancestor_call_id``: a fork's call reaches
its source call and that call's ancestors, on into a source's own source (``docs/fork.md``).
``grove_rollouts``: one row per selected attempt with its decision, training step and how many
contradictions its attempt holds (a rollout with any never trains).
``grove_contradictions``: each event the lifecycle rules left out of an attempt, and why.
``docs/sql.md`` is the cookbook of queries over them.

These are the definitions of the head revision: the newest migration that touches the views
re-creates them from here. Changing one takes a new migration that drops and re-creates them, and
the migration that created them until then keeps a frozen copy of its own SQL (as 0002 does), so
that upgrading an empty database never runs today's views on an older schema.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["VIEWS", "create_view_statements", "drop_view_statements"]

VIEWS: dict[str, str] = {
    "grove_calls": """
        SELECT c.capture_key, a.rollout_id, a.prompt_group, a.rollout_index, c.call_id,
               c.parent_call_id, c.decision, c.root_reason, c.status, c.late,
               c.prompt_tokens, c.prev_len, c.delta_len, c.cum_len, c.generated_len,
               c.finish_reason, c.response_id, c.failure_reason, c.blob_key,
               c.selection_index, (c.selection_index IS NOT NULL) AS selected,
               c.intended_position, c.resolved_position, c.policy_version,
               c.source_capture_key
        FROM grove_proj_calls c
        JOIN grove_proj_attempts a ON a.capture_key = c.capture_key
    """,
    "grove_call_lineage": """
        WITH RECURSIVE lineage (
            capture_key, call_id, ancestor_capture_key, ancestor_call_id, depth
        ) AS (
            SELECT capture_key, call_id, capture_key, call_id, 0 FROM grove_proj_calls
            UNION ALL
            SELECT l.capture_key, l.call_id, COALESCE(c.source_capture_key, c.capture_key),
                   c.parent_call_id, l.depth + 1
            FROM lineage l
            JOIN grove_proj_calls c
              ON c.capture_key = l.ancestor_capture_key AND c.call_id = l.ancestor_call_id
            WHERE c.parent_call_id IS NOT NULL
        )
        SELECT capture_key, call_id, ancestor_call_id, depth, ancestor_capture_key FROM lineage
    """,
    "grove_rollouts": """
        SELECT r.capture_key, r.rollout_id, r.prompt_group, a.rollout_index, a.policy_version,
               r.policy, r.reward, r.terminal_response_id, r.selected_calls, r.status,
               r.masked_reason, r.rows, r.step,
               (SELECT COUNT(*) FROM grove_proj_calls c WHERE c.capture_key = r.capture_key)
                   AS captured_calls,
               (SELECT COUNT(*) FROM grove_proj_contradictions x
                 WHERE x.capture_key = r.capture_key) AS contradictions
        FROM grove_proj_rollouts r
        JOIN grove_proj_attempts a ON a.capture_key = r.capture_key
    """,
    "grove_contradictions": """
        SELECT x.capture_key, a.rollout_id, x.stream_version, x.position, x.event_type,
               x.call_id, x.contradiction
        FROM grove_proj_contradictions x
        LEFT JOIN grove_proj_attempts a ON a.capture_key = x.capture_key
    """,
}


def create_view_statements(views: Mapping[str, str] = VIEWS) -> tuple[str, ...]:
    """``CREATE VIEW`` statements for every lineage view (``views``: a migration's frozen copy
    of its own definitions, by default the head revision's)."""
    return tuple(f"CREATE VIEW {name} AS {body.strip()}" for name, body in views.items())


def drop_view_statements(views: Mapping[str, str] = VIEWS) -> tuple[str, ...]:
    """``DROP VIEW`` statements for ``views``, in reverse order of creation."""
    return tuple(f"DROP VIEW IF EXISTS {name}" for name in reversed(list(views)))
