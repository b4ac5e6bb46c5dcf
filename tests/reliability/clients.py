"""The client processes of the concurrency suite: each races the others for one call id, makes
calls into an attempt all clients share, then plays its own rollouts, and writes what the gateway
acknowledged to a JSON file (``run_client`` is a process target).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from multiprocessing.synchronize import Barrier
from pathlib import Path

import httpx

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER

from .conftest import MODEL
from .harness import Ack, Harness

__all__ = ["RACED_CALL", "RACE_ATTEMPT", "SHARED_ATTEMPT", "SHARED_TOKENS", "run_client"]

RACE_ATTEMPT = "race"
RACED_CALL = "c0"
SHARED_ATTEMPT = "shared"
SHARED_TOKENS = {RACE_ATTEMPT: "race-attempt-token-" + "r" * 20, SHARED_ATTEMPT: "s" * 40}
"""The tokens the test proposes when it opens the attempts every client shares."""


def run_client(
    base_url: str, client: int, shared_calls: int, rollouts: int, barrier: Barrier, out: str
) -> None:
    """Race for ``RACED_CALL``, make ``shared_calls`` calls in ``SHARED_ATTEMPT``, play
    ``rollouts`` rollouts; write ``{"race_status", "acks"}`` to ``out``."""
    harness = Harness(base_url, seed=client)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Race."}], "max_tokens": 4}
    headers = {
        CAPTURE_KEY_HEADER: RACE_ATTEMPT,
        ATTEMPT_TOKEN_HEADER: SHARED_TOKENS[RACE_ATTEMPT],
        CALL_ID_HEADER: RACED_CALL,
    }
    barrier.wait(60)
    race = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    if race.status_code == 200:
        harness.acks.append(Ack(RACE_ATTEMPT, "call.committed", RACED_CALL, race.json()["id"]))
    for n in range(shared_calls):
        call_id = f"p{client}-{n}"
        completion = harness.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Client {client}, question {n}."}],
            max_tokens=4,
            extra_headers={
                CAPTURE_KEY_HEADER: SHARED_ATTEMPT,
                ATTEMPT_TOKEN_HEADER: SHARED_TOKENS[SHARED_ATTEMPT],
                CALL_ID_HEADER: call_id,
            },
        )
        harness.acks.append(Ack(SHARED_ATTEMPT, "call.committed", call_id, completion.id))
    for index in range(rollouts):
        key = f"c{client}-r{index}"
        progress = harness.play(key, key, f"g-c{client}", index)
        assert harness.post_result(progress), f"{key}: result refused"
    harness.close()
    record = {"race_status": race.status_code, "acks": [asdict(a) for a in harness.acks]}
    Path(out).write_text(json.dumps(record))
