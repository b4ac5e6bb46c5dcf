"""The request a gateway route sees (``capture/body_limits.py``, ``CheckedBodyRequest``): the
body the door read and parsed, and a disconnect check that never waits."""

from __future__ import annotations

import asyncio
from typing import Any

from grove.capture.body_limits import CHECKED_BODY, CheckedBody, CheckedBodyRequest


def request(receive: Any, **scope: Any) -> CheckedBodyRequest:
    return CheckedBodyRequest({"type": "http", "headers": [], **scope}, receive)


async def unread() -> dict[str, Any]:
    raise AssertionError("the body is not read again")


def test_json_answers_the_document_the_door_parsed_without_reading_the_body():
    document = {"messages": []}
    checked = CheckedBody(b'{"messages": []}', document)
    assert asyncio.run(request(unread, **{CHECKED_BODY: checked}).json()) is document


def test_body_answers_the_bytes_the_door_read_and_takes_them():
    checked = CheckedBody(b'{"messages": []}', {"messages": []})
    assert asyncio.run(request(unread, **{CHECKED_BODY: checked}).body()) == checked.data
    assert checked.taken


def test_a_body_another_reader_took_is_read_from_receive():
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"[]", "more_body": False}

    checked = CheckedBody(b"[]", [], taken=True)
    assert asyncio.run(request(receive, **{CHECKED_BODY: checked}).body()) == b"[]"


def test_json_parses_the_body_when_the_door_did_not():
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"a": [1]}', "more_body": False}

    assert asyncio.run(request(receive).json()) == {"a": [1]}


def test_a_disconnect_that_receive_answers_at_once_is_seen():
    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    assert asyncio.run(request(receive).is_disconnected()) is True


def test_a_body_message_is_no_disconnect():
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    assert asyncio.run(request(receive).is_disconnected()) is False


def test_a_receive_that_would_wait_answers_connected_and_leaves_nothing_waiting():
    async def check() -> tuple[bool, bool, int]:
        arrived = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await arrived.wait()
            return {"type": "http.disconnect"}

        connection = request(receive)
        first = await asyncio.wait_for(connection.is_disconnected(), 1.0)
        waiting = len(arrived._waiters)  # the abandoned wait took its waiter with it
        arrived.set()
        return first, await connection.is_disconnected(), waiting

    assert asyncio.run(check()) == (False, True, 0)


def test_once_disconnected_it_stays_disconnected_without_asking_again():
    answers = iter([{"type": "http.disconnect"}])

    async def receive() -> dict[str, Any]:
        return next(answers)

    async def twice() -> list[bool]:
        connection = request(receive)
        return [await connection.is_disconnected(), await connection.is_disconnected()]

    assert asyncio.run(twice()) == [True, True]
