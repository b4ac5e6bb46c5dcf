"""Forks against replays: the generated tokens it takes to obtain continuations of a late state.

Usage: ``python -m bench.fork [--quick] [--json]``

An 8-turn agent (``bench/support/turn_agent.py``: each turn after the first appends an
observation that depends only on the turn, then asks the model) plays through Grove's gateway
over real HTTP with the official ``openai`` client; the gateway (``build_gateway``, the embedded
tiny model Grove builds offline, SQLite and local blobs) runs in a thread of this process. Every
call samples at temperature 1 with its own seed. For each recorded rollout (a *source*), four
continuations of its state at turn 4 (the chain up to and including turn 4's answer) are
obtained two ways:

- ``fork``: four attempts opened with ``fork_from`` on the source's turn-4 call
  (``docs/fork.md``), each sending the source conversation plus turn 5's observation and playing
  turns 5 to 8: only the new turns are generated;
- ``replay``: four rollouts of the same agent played from turn 1 with other seeds, as a harness
  without forks would, keeping those whose chain at turn 4's call has exactly the source's tokens
  (read from the ledger and the blobs).

Figures: generated tokens (``usage.completion_tokens``) per continuation obtained, each side, and
``replay_over_fork_generated_tokens`` (aim >= 3). Replays are counted honestly: the tokens they
spent over the continuations they obtained. When none reaches the state the ratio has no finite
value yet; the key then holds what it would be at best had one more replay reached the state:
the tokens spent plus one more replay's, over that one continuation (``replay_ratio_basis`` says
which), a lower bound of the true ratio given what was observed. The probability that one
replay reaches the state is measured too: at temperature 1 it is the product of the recorded
probabilities of the source chain's generated tokens, so ``replay_reach_probability_log10`` is
their logprob sum over ln 10 (the most reachable source), and
``expected_replay_over_fork_generated_tokens_log10`` the ratio a replay harness should expect.

``fork_rows_exact`` (1 or 0): the projector (``Projector``, following the fork attempts) publishes
one step per source with its four forks as a prompt group, and every rollout's rows equal the
reference built by hand from the ledger (``bench/support/fork_rows.py``,
``tests/fixtures/fork_reference.py``): the source chain's tokens read through the source's own
commits, then the fork's tokens, loss and logprobs only on the fork's generated tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench.support.fork_rows import (
    batch_rows,
    chain_records,
    expected_fork_row,
    generated_logprob_sum,
)
from bench.support.report import print_figures
from bench.support.turn_agent import Conversation, TurnAgent, call_id
from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway
from grove.storage import BlobStore, open_blob_store
from grove.training.forest import CallRecord
from grove.training.projector import Projector, ProjectorSettings
from grove.workspace import Workspace

AIM: Final = 3.0  # replay_over_fork_generated_tokens, higher is better
FORK_PREFIX: Final = "fork-"


@dataclass(frozen=True)
class Workload:
    """``sources`` recorded rollouts of a ``turns``-turn agent, each continued from turn
    ``fork_turn`` ``continuations`` times by forks and by replays; ``max_tokens`` per call."""

    turns: int = 8
    fork_turn: int = 4
    continuations: int = 4
    max_tokens: int = 24
    sources: int = 3


FULL: Final = Workload()
QUICK: Final = Workload(max_tokens=8, sources=1)


@dataclass
class Side:
    """One way of obtaining continuations: generated tokens spent, rollouts played,
    continuations obtained, wall seconds of its plays."""

    generated_tokens: int = 0
    rollouts: int = 0
    continuations: int = 0
    wall_s: float = 0.0

    def count(self, generated_tokens: int, *, obtained: bool) -> None:
        """One rollout played: its generated tokens, and whether it obtained a continuation."""
        self.generated_tokens += generated_tokens
        self.rollouts += 1
        self.continuations += obtained

    @property
    def per_continuation(self) -> float | None:
        """Generated tokens per continuation obtained (None: none obtained)."""
        return self.generated_tokens / self.continuations if self.continuations else None

    def figures(self, side: str) -> dict[str, Any]:
        """This side's figures, each key prefixed with ``side``."""
        per = self.per_continuation
        return {
            f"{side}_generated_tokens": self.generated_tokens,
            f"{side}_rollouts": self.rollouts,
            f"{side}_continuations": self.continuations,
            f"{side}_generated_tokens_per_continuation": None if per is None else round(per, 2),
            f"{side}_wall_s": round(self.wall_s, 2),
        }


def replay_ratio(fork: Side, replay: Side) -> tuple[float, str]:
    """``replay_over_fork_generated_tokens`` and its basis: replay tokens per continuation
    obtained over fork tokens per continuation (``obtained``); when no replay obtained one, the
    ratio had the next replay reached the state: the tokens spent plus one more replay's over
    one continuation (``at_least_one_more_replay``), a lower bound of the true ratio."""
    per_fork = fork.per_continuation
    if per_fork is None:
        raise ValueError("forks obtained no continuation: there is nothing to compare with")
    per_replay = replay.per_continuation
    if per_replay is not None:
        return per_replay / per_fork, "obtained"
    next_replay = replay.generated_tokens / replay.rollouts
    return (replay.generated_tokens + next_replay) / per_fork, "at_least_one_more_replay"


@contextlib.contextmanager
def gateway(workdir: Path) -> Iterator[tuple[str, AttemptLog, BlobStore]]:
    """Grove's gateway on the embedded model, SQLite and local blobs under ``workdir``, served
    in a thread: its base URL, and the ledger and blobs as a reader opens them."""
    workspace = Workspace(workdir, f"sqlite:///{workdir / 'ledger.db'}", str(workdir / "blobs"))
    with ServerThread(build_gateway(workspace)) as server:
        store = EventStore.open(workspace.database_url)
        try:
            yield server.base_url, AttemptLog(store), open_blob_store(workspace.blob_url)
        finally:
            store.close()


def _seeds(rollout: int) -> Callable[[int], int]:
    """Rollout ``rollout``'s seed per turn: each play of the agent samples its own stream."""
    return lambda turn: 1000 * rollout + turn


def _tokens(chain: Sequence[CallRecord]) -> list[int]:
    """A chain's tokens, root first: each call's prompt delta, then its generation."""
    return [t for call in chain for t in (*call.prompt_tokens, *call.generated_tokens)]


@dataclass(frozen=True)
class Source:
    """A recorded rollout: its capture key, the conversation its harness kept up to the fork
    turn's answer, and its chain up to the fork turn's call as the ledger holds it."""

    key: str
    state: list[dict[str, Any]]
    chain: list[CallRecord]


class ForkBench:
    """The agent, the ledger and the projector of one run; each source is recorded, forked,
    replayed and its forks' rows checked in turn, and both sides counted."""

    def __init__(self, workload: Workload, base_url: str, log: AttemptLog, blobs: BlobStore):
        self.workload = workload
        self.agent = TurnAgent(base_url, EMBEDDED_MODEL_NAME, workload.max_tokens)
        self.log, self.blobs = log, blobs
        settings = ProjectorSettings(
            rollouts_per_group=workload.continuations,
            groups_per_step=1,
            capture_prefix=FORK_PREFIX,
        )
        self.projector = Projector(log.store, blobs, settings)
        self.fork, self.replay = Side(), Side()
        self.rollouts = 0  # rollouts played: each takes the next seed stream

    def _next_seeds(self) -> Callable[[int], int]:
        self.rollouts += 1
        return _seeds(self.rollouts)

    def record(self, s: int) -> Source:
        """Play source ``s`` through all turns and post its result."""
        key, t, seeds = f"src-{s}", self.workload.fork_turn, self._next_seeds()
        self.agent.open(key, group=key, index=0)
        played = Conversation()
        self.agent.play(key, played, range(1, t + 1), seeds)
        state = list(played.messages)  # the harness keeps its history up to turn t
        self.agent.play(key, played, range(t + 1, self.workload.turns + 1), seeds)
        self.agent.post_result(key, played, reward=1.0)
        return Source(key, state, chain_records(self.log, self.blobs, key, call_id(t)))

    def forks(self, s: int, source: Source) -> None:
        """Open the continuations of ``source`` as forks of its fork turn's call and play the
        turns after it; each is rollout ``j`` of prompt group ``fork-{s}``."""
        t, began = self.workload.fork_turn, time.perf_counter()
        for j in range(self.workload.continuations):
            key = f"{FORK_PREFIX}{s}-{j}"
            opened = self.agent.open(
                key, group=f"{FORK_PREFIX}{s}", index=j, fork_from=(source.key, call_id(t))
            )
            if opened["fork_from"]["answer"] != source.state[-1]["content"]:
                raise RuntimeError(f"{key} opened with another answer than {source.key}'s")
            played = Conversation(messages=list(source.state))
            turns = range(t + 1, self.workload.turns + 1)
            self.agent.play(key, played, turns, self._next_seeds())
            self.agent.post_result(key, played, reward=float(j % 2))
            self.fork.count(played.generated_tokens, obtained=True)
        self.fork.wall_s += time.perf_counter() - began

    def replays(self, s: int, source: Source) -> None:
        """Replay the agent from turn 1 as many times; a replay obtains a continuation when its
        chain at the fork turn's call holds exactly ``source``'s tokens."""
        t, began = self.workload.fork_turn, time.perf_counter()
        for j in range(self.workload.continuations):
            key = f"replay-{s}-{j}"
            self.agent.open(key, group=f"replay-{s}", index=j)
            played = Conversation()
            self.agent.play(key, played, range(1, self.workload.turns + 1), self._next_seeds())
            chain = chain_records(self.log, self.blobs, key, call_id(t))
            self.replay.count(
                played.generated_tokens, obtained=_tokens(chain) == _tokens(source.chain)
            )
        self.replay.wall_s += time.perf_counter() - began

    def rows_exact(self, s: int, source: Source) -> bool:
        """Publish step ``s`` with the forks of ``source`` and compare its rows with the
        reference."""
        while self.projector.poll():
            pass
        published = self.projector.batch_for_step(s, groups=[f"{FORK_PREFIX}{s}"])
        if published is None:
            raise RuntimeError(f"the forks of {source.key} were not published")
        origin = (source.key, call_id(self.workload.fork_turn))
        keys = [f"{FORK_PREFIX}{s}-{j}" for j in range(self.workload.continuations)]
        expected = {
            key: [
                expected_fork_row(self.log, self.blobs, origin, key, call_id(self.workload.turns))
            ]
            for key in keys
        }
        return batch_rows(published.batch) == expected

    def close(self) -> None:
        """Close the agent's connections."""
        self.agent.close()


def run_benchmark(workload: Workload) -> dict[str, Any]:
    """Forks and replays of every source, the rows check, and the figures."""
    began = time.perf_counter()
    notes = [f"load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"]
    sources: list[Source] = []
    exact = True
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="grove-fork-")))
        bench = ForkBench(workload, *stack.enter_context(gateway(workdir)))
        stack.callback(bench.close)
        for s in range(workload.sources):
            sources.append(bench.record(s))
            bench.forks(s, sources[-1])
            bench.replays(s, sources[-1])
            exact &= bench.rows_exact(s, sources[-1])
    fork, replay = bench.fork, bench.replay
    ratio, basis = replay_ratio(fork, replay)
    if basis != "obtained":
        notes.append(
            f"no replay reached the state at turn {workload.fork_turn} ({replay.rollouts} "
            "played): replay_over_fork_generated_tokens is the ratio had one more replay "
            "reached it, a lower bound; the true ratio has no finite value yet"
        )
    notes.append(f"ran {time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.2f}")
    # at temperature 1 a replay reaches the state with the product of the recorded probabilities
    # of the chain's generated tokens; the most reachable source is the replays' best case
    reach_log10 = max(generated_logprob_sum(s.chain) for s in sources) / math.log(10)
    per_replay = replay.generated_tokens / replay.rollouts
    return {
        "replay_over_fork_generated_tokens": round(ratio, 3),
        "replay_ratio_basis": basis,
        "fork_rows_exact": int(exact),
        **fork.figures("fork"),
        **replay.figures("replay"),
        "replay_generated_tokens_per_replay": round(per_replay, 2),
        "replay_reach_probability_log10": round(reach_log10, 1),
        "expected_replay_over_fork_generated_tokens_log10": round(
            math.log10(per_replay / fork.per_continuation) - reach_log10, 1
        ),
        "state_tokens": round(sum(len(_tokens(s.chain)) for s in sources) / len(sources), 1),
        "aim": AIM,
        "workload": asdict(workload),
        "notes": notes,
    }


SIDE_COLUMNS: Final = {  # figure: heading
    "generated_tokens": "generated",
    "rollouts": "rollouts",
    "continuations": "obtained",
    "generated_tokens_per_continuation": "per obtained",
    "wall_s": "wall s",
}
HEADLINE: Final = (
    "replay_over_fork_generated_tokens",
    "replay_ratio_basis",
    "fork_rows_exact",
    "replay_reach_probability_log10",
    "expected_replay_over_fork_generated_tokens_log10",
)


def print_report(report: Mapping[str, Any]) -> None:
    """The two sides as a table, then the keys and the notes."""
    w = report["workload"]
    print(
        f"{w['sources']} source(s) of {w['turns']} turns, {w['continuations']} continuations of "
        f"turn {w['fork_turn']} each, max_tokens {w['max_tokens']}; state: "
        f"{report['state_tokens']} tokens"
    )
    print(f"{'':8}" + "".join(f"{heading:>14}" for heading in SIDE_COLUMNS.values()))
    for side in ("fork", "replay"):
        cells = (report[f"{side}_{name}"] for name in SIDE_COLUMNS)
        print(f"{side:8}" + "".join(f"{'none' if c is None else c:>14}" for c in cells))
    print()
    print_figures({name: report[name] for name in HEADLINE}, as_json=False)
    print(f"aim: replay_over_fork_generated_tokens >= {report['aim']}")
    for note in report["notes"]:
        print(f"note: {note}")


def main() -> None:
    """Run the benchmark; print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one source, 8 tokens per call")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    report = {**run_benchmark(QUICK if args.quick else FULL), "quick": args.quick}
    if args.json:
        print_figures(report, as_json=True)
    else:
        print_report(report)


if __name__ == "__main__":
    main()
