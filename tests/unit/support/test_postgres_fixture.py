"""Where no PostgreSQL answers, the test session starts a throwaway cluster of its own."""

from __future__ import annotations

import os

import pytest

from tests.fixtures import postgres


@pytest.mark.skipif(postgres._pg_bin("initdb") is None, reason="PostgreSQL server binaries absent")
def test_without_a_server_the_session_starts_and_removes_a_throwaway_cluster(monkeypatch):
    monkeypatch.delenv("GROVE_TEST_DATABASE_URL", raising=False)
    monkeypatch.setattr(postgres, "DEFAULT_URL", "postgresql+psycopg://postgres@127.0.0.1:9/none")
    server, cluster, reason = postgres.obtain_server()
    try:
        assert reason == ""
        assert server.origin.startswith("throwaway cluster on port ")
        assert postgres._answers(server.url)
    finally:
        cluster.stop()
    assert not postgres._answers(server.url, timeout=1)
    assert not os.path.exists(cluster.dir)


def test_a_configured_url_that_does_not_answer_is_reported(monkeypatch):
    monkeypatch.setenv("GROVE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:9/x")
    server, cluster, reason = postgres.obtain_server()
    assert (server, cluster) == (None, None)
    assert (
        reason
        == "GROVE_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:9/x does not answer"
    )
