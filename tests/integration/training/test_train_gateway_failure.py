"""``grove train`` stopped by a failure of the gateway its harness talks to: one ``error:`` line
and exit status 75 (the gateway failed on its side: ``grove.client.GatewayServerError``), never a
traceback of the client's error (grove/errors.py, docs/reliability.md "Errors and exit statuses").

The failure is a real one: the run's custom selection policy raises ``ValueError``, which the
gateway answers as 500 ``internal_error`` with an incident id (not as a 422 that would blame the
harness's result), and the harness's ``post_result`` receives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.config.runs import merged, tiny_configuration

FAULTY = "tests.integration.training.faulty_policies:misparse"
REPOSITORY = Path(__file__).resolve().parents[3]


def test_a_gateway_failure_stops_grove_train_with_one_line_and_status_75(tmp_path: Path):
    config = merged(
        tiny_configuration(tmp_path),
        {"token_capture": {"forest_training": True, "selection_policy": FAULTY}},
    )
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    grove = str(Path(sys.executable).parent / "grove")
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "COLUMNS": "200"}
    trained = subprocess.run(
        [grove, "train", str(path), "--steps", "1", "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPOSITORY,
        env=env,
    )
    errors = [line for line in trained.stderr.splitlines() if line.startswith("error:")]
    assert trained.returncode == 75, trained.stderr[-3000:]
    assert len(errors) == 1
    assert errors[0].startswith("error: POST /v1/attempts/")
    assert "/result answered 500 internal_error: Internal error " in errors[0]
    assert trained.stderr.rstrip().endswith(errors[0])
    assert "GatewayServerError" not in trained.stderr  # the client's error has no traceback
    assert "ValueError" in trained.stderr  # the gateway's log holds the policy's own traceback
