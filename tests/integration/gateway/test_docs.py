"""docs/gateway.md's harness example runs against a gateway built by ``grove.services.serve``."""

from __future__ import annotations

import re
from pathlib import Path

from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace

DOC = Path(__file__).resolve().parents[3] / "docs" / "gateway.md"


def test_the_harness_example_records_a_compaction_and_a_selection(tmp_path: Path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    example = next(block for block in blocks if "OpenAI(" in block)
    namespace: dict[str, object] = {}
    with ServerThread(build_gateway(Workspace.resolve(tmp_path), auth_token="s3cret")) as server:
        exec(example.replace("http://127.0.0.1:8000", server.base_url), namespace)
        status = namespace["gateway"].get("/v1/attempts/g0-r0-a0").json()  # type: ignore[attr-defined]
    decisions = [(call["decision"], call["root_reason"]) for call in status["calls"]]
    assert decisions == [
        ("root", "first_call"),
        ("continuation", None),
        ("continuation", None),
        ("root", "history_rewritten"),
    ]
    assert status["selection"]["call_ids"] == [call["call_id"] for call in status["calls"]]
