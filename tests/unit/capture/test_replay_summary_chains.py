"""``replay_summary`` given the items' prefix digests is the summary it chains itself."""

from __future__ import annotations

from grove.capture.render import admission_items, normalize_messages, replay_summary
from grove.ledger.admission import prefix_digests

MESSAGES = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
    {"role": "tool", "content": "4"},
]


def test_a_summary_from_given_prefix_digests_is_the_summary_chained_anew() -> None:
    items = admission_items(normalize_messages(MESSAGES))
    chains = tuple(prefix_digests(items))
    assert replay_summary(items, "f" * 64, chains) == replay_summary(items, "f" * 64)
