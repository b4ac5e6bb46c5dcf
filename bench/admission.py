"""Candidate admission time per call at calls 10, 100 and 1,000 of one attempt, beside a baseline.

Usage: ``python -m bench.admission [--quick] [--json]``

Admission starts from the normalized request (normalization is shared with rendering, and timed
on its own as ``normalization_us``). Grove digests the request's items, chains the digests in one
pass and looks the boundary up in the attempt's index (``ledger/admission.py``). The baseline, run
in the same process on the same requests, compares the request with every earlier call's full
message list (request plus output), keeping the longest compatible prefix: its cost grows with
the number of earlier calls.

Two workloads of one attempt each:
- ``compaction`` (the headline): a tool-using agent with a recency policy; when its history
  exceeds a window it rewrites it to a summary plus its latest turns (a new root). Requests stay
  bounded while the number of earlier calls grows, so this isolates the cost of earlier calls:
  ``grove_call1000_over_call10`` (aim <= 2) and ``baseline_call1000_over_call10``.
- ``growing``: the same agent never compacts, so the request at call n has about 2n items; both
  sides then pay for the request's own length (Grove hashes each item once), reported for honesty.

Times are the median of repeated admissions of the same request (admission is pure), in
microseconds; the two sides must reach the same parent at every measured call.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grove.capture.render import (
    NormalizedRequest,
    admission_items,
    normalize_messages,
    replay_summary,
)
from grove.ledger.admission import (
    OBSERVATION_ROLES,
    AdmissionIndex,
    CallStatus,
    DecisionKind,
    admit,
)

Message = Mapping[str, Any]
MEASURED_CALLS = (10, 100, 1000)
OPTIONS_DIGEST = "0" * 64
WINDOW = 24  # history items after the head that the recency policy keeps before it rewrites
KEEP = 4  # latest items kept beside the summary at a rewrite
SYSTEM = {"role": "system", "content": "You are a careful research agent. " * 6}
TASK = {"role": "user", "content": "Find the three most cited papers on the topic, then summarize."}


def agent_turns(*, compact: bool) -> Iterator[tuple[list[Message], Message, list[Message]]]:
    """Yield (request, output, observations) per call of one attempt, forever."""
    history: list[Message] = []
    n = 0
    while True:
        n += 1
        request = [SYSTEM, TASK, *history]
        if n % 2:
            arguments = json.dumps({"query": f"citations page {n}", "limit": 10})
            output: Message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": "search", "arguments": arguments},
                    }
                ],
            }
            observations = [
                {"role": "tool", "tool_call_id": f"call_{n}", "content": f"result {n}: " * 40}
            ]
        else:
            output = {"role": "assistant", "content": f"Noted finding {n}. " * 15}
            observations = [{"role": "user", "content": f"Continue with step {n + 1}."}]
        yield request, output, observations
        history = [*history, output, *observations]
        if compact and len(history) > WINDOW:
            summary = {"role": "user", "content": f"Summary of the first {n} steps. " * 10}
            history = [summary, *history[-KEEP:]]


def grove_admit(request: NormalizedRequest, index: AdmissionIndex) -> str | None:
    """Grove: digest the items, chain them once, look the boundary up."""
    items = admission_items(request)
    decision = admit(items, render_options_digest=OPTIONS_DIGEST, index=index)
    return decision.parent_call_id if decision.kind is DecisionKind.CONTINUATION else None


@dataclass(frozen=True)
class EarlierCall:
    """The baseline's record of a committed call: its full normalized message list."""

    call_id: str
    messages: tuple[dict[str, Any], ...]
    options_digest: str


def baseline_admit(request: NormalizedRequest, earlier: Sequence[EarlierCall]) -> str | None:
    """Baseline: compare the request with every earlier call's full message list."""
    messages = request.messages
    best: EarlierCall | None = None
    for call in earlier:
        length = len(call.messages)
        if (
            length < len(messages)
            and call.options_digest == OPTIONS_DIGEST
            and messages[:length] == call.messages
            and all(m["role"] in OBSERVATION_ROLES for m in messages[length:])
            and (best is None or length > len(best.messages))
        ):
            best = call
    return None if best is None else best.call_id


def median_us(run: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``run`` in microseconds, garbage collection paused."""
    gc.collect()
    gc.disable()
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            run()
            times.append(time.perf_counter_ns() - start)
    finally:
        gc.enable()
    return statistics.median(times) / 1000


def measure(*, compact: bool, repeats: int) -> dict[str, Any]:
    """Admission times at the measured calls of one attempt of the agent."""
    index = AdmissionIndex()
    earlier: list[EarlierCall] = []
    grove_us: dict[str, float] = {}
    baseline_us: dict[str, float] = {}
    normalization_us: dict[str, float] = {}
    request_items: dict[str, int] = {}
    turns = agent_turns(compact=compact)
    source: list[Message] = []  # the previous call's request plus output, as sent
    normalized: tuple[dict[str, Any], ...] = ()
    summary = replay_summary((), OPTIONS_DIGEST)
    for n in range(1, max(MEASURED_CALLS) + 1):
        request, output, _ = next(turns)
        if n in MEASURED_CALLS:
            normalized_request = normalize_messages(request)
            parent = grove_admit(normalized_request, index)
            if parent != baseline_admit(normalized_request, earlier):
                raise RuntimeError(f"call {n}: Grove and the baseline chose different parents")
            key = str(n)
            grove_us[key] = median_us(lambda r=normalized_request: grove_admit(r, index), repeats)
            baseline_us[key] = median_us(
                lambda r=normalized_request: baseline_admit(r, earlier), repeats
            )
            normalization_us[key] = median_us(lambda r=request: normalize_messages(r), repeats)
            request_items[key] = len(request)
        # Commit call n (setup, not timed). Where the history grew by appending, only the new
        # items are normalized and chained, so building 1,000 calls stays linear.
        if request[: len(source)] != source:
            source, normalized, summary = [], (), replay_summary((), OPTIONS_DIGEST)
        new = normalize_messages([*request[len(source) :], output])
        source, normalized = [*request, output], normalized + new.messages
        summary = summary.extended(admission_items(new))
        index.add(summary.candidate(f"c{n}", CallStatus.COMMITTED))
        earlier.append(EarlierCall(f"c{n}", normalized, OPTIONS_DIGEST))
    return {
        "grove_us": grove_us,
        "baseline_us": baseline_us,
        "normalization_us": normalization_us,
        "request_items": request_items,
        "grove_call1000_over_call10": round(grove_us["1000"] / grove_us["10"], 2),
        "baseline_call1000_over_call10": round(baseline_us["1000"] / baseline_us["10"], 2),
    }


def main() -> None:
    """Run both workloads and print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    repeats = 5 if args.quick else 25
    compaction = measure(compact=True, repeats=repeats)
    growing = measure(compact=False, repeats=max(3, repeats // 5))
    result = {
        "grove_call1000_over_call10": compaction["grove_call1000_over_call10"],
        "baseline_call1000_over_call10": compaction["baseline_call1000_over_call10"],
        "workload": "compaction",
        "compaction": compaction,
        "growing": growing,
        "repeats": repeats,
        "quick": args.quick,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{'workload':<11} {'call':>5} {'items':>6} {'grove_us':>10} {'baseline_us':>12} "
        f"{'normalization_us':>17}"
    )
    for name, run in (("compaction", compaction), ("growing", growing)):
        for n in map(str, MEASURED_CALLS):
            print(
                f"{name:<11} {n:>5} {run['request_items'][n]:>6} "
                f"{run['grove_us'][n]:>10.1f} {run['baseline_us'][n]:>12.1f} "
                f"{run['normalization_us'][n]:>17.1f}"
            )
    print(f"grove_call1000_over_call10    = {result['grove_call1000_over_call10']} (aim <= 2)")
    print(f"baseline_call1000_over_call10 = {result['baseline_call1000_over_call10']}")


if __name__ == "__main__":
    main()
