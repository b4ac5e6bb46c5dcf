"""The SQL the debugging tools run is the SQL docs/sql.md shows (where it runs verbatim on both
databases, ``tests/integration/ledger/test_sql_cookbook.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grove.tools import lineage, replay

COOKBOOK = Path(__file__).resolve().parents[3] / "docs" / "sql.md"
DOCUMENTED = {q.strip() for q in re.findall(r"```sql\n(.*?)```", COOKBOOK.read_text(), flags=re.S)}
EXAMPLES = {":key": "'att-1'", ":rollout_id": "'r0'", ":prompt_group": "'g0'"}
QUERIES = {
    **{f"lineage.{name}": query for name, query in lineage.QUERIES.items()},
    **{f"replay.{name}": query for name, query in replay.QUERIES.items()},
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_tool_query_is_in_the_cookbook_with_example_values(name: str):
    query = QUERIES[name].strip()
    for parameter, example in EXAMPLES.items():
        query = query.replace(parameter, example)
    assert f"{query};" in DOCUMENTED, f"docs/sql.md lacks the query {name}:\n{query};"
