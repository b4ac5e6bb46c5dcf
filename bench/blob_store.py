"""Blob storage: delta records against full-context storage; store against raw fsspec throughput.

Usage: ``python -m bench.blob_store [--quick] [--json]``

- ``naive_over_delta_bytes``: for rollouts of 2, 20 and 50 calls in one context, each call adding
  200 new tokens (100 observation tokens, then 100 generated tokens with their logprobs), the
  bytes stored when every call stores its full current context (the naive baseline: every call a
  root) over the bytes stored by delta records (a root, then continuations storing only their
  delta). Both are real ``put_delta`` calls into a local store, codec overhead included.
  ``naive_over_delta_tokens`` is the same ratio in token ids, exactly ``(n + 1) / 2``; the byte
  ratio is lower because logprobs are stored only for a call's own generated tokens either way.
- ``put_over_raw`` / ``get_over_raw``: ``BlobStore.put`` (key validation, sha256, write-once
  create) and ``BlobStore.get`` (read, size and sha256 verification) over raw fsspec
  ``pipe_file`` / ``cat_file`` of the same bytes (the delta blobs of the 20-call rollout) on the
  same filesystem, in the same run, operation by operation, alternating. A local put returns only
  once the blob is on disk (``storage/local.py``), so the local raw put is made as durable: the
  file and its directory are fsynced after ``pipe_file`` (``bench/durability.py`` measures what
  the syncs cost); an S3 PUT is durable when it is answered either way. On S3 the raw put is
  s3fs's ``pipe_file`` (its event-loop thread) and Grove's put one synchronous ``PutObject``, and
  both reads are the store's filesystem's ``cat_file``, Grove's one-GET read (``storage/s3.py``),
  so there ``get_over_raw`` measures the store's checks alone. Measured on a local
  directory and on a moto S3 server started in a subprocess; the top-level figure is the lower
  of the two (aim >= 0.8).
- ``put_delta_cpu_over_torch_save``: the CPU time (``time.thread_time``: this thread's user and
  system time, the fsyncs' kernel time included) of one local ``put_delta`` of a typical gateway
  call's delta (60 new prompt tokens, 18 generated tokens with logprobs, two short messages) over
  that of the same put encoded as the codec did before its own encoder: the torch-op checks, then
  ``safetensors.torch.save`` (``torch_save_encode`` below, the baseline; same bytes). Measured in
  the same process, put by put, alternating which goes first; lower is better. ``put_delta_cpu``
  also holds each figure in microseconds (trimmed mean), the same ratio for the encoding alone
  (``encode_cpu_over_torch_save``) and the CPU of ``CallDelta.from_lists`` of the same delta.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import safetensors.torch
import torch
from botocore.exceptions import EndpointConnectionError

from grove.storage import (
    BlobRef,
    BlobStore,
    CallDelta,
    InvalidDeltaError,
    encode_delta,
    open_blob_store,
    staging_key,
)
from grove.storage.local import sync_directory

CALL_COUNTS = (2, 20, 50)
OBSERVATION_TOKENS = 100
GENERATED_TOKENS = 100


def _tokens(generator: torch.Generator, count: int) -> torch.Tensor:
    return torch.randint(0, 150_000, (count,), dtype=torch.int32, generator=generator)


def rollout_deltas(calls: int, seed: int = 0) -> tuple[list[CallDelta], list[CallDelta]]:
    """The delta records and the naive full-context records of one rollout of ``calls`` calls."""
    generator = torch.Generator().manual_seed(seed)
    deltas, naive = [], []
    context = torch.zeros(0, dtype=torch.int32)
    for _ in range(calls):
        observation = _tokens(generator, OBSERVATION_TOKENS)
        generated = _tokens(generator, GENERATED_TOKENS)
        logprobs = -torch.rand(GENERATED_TOKENS, generator=generator)
        deltas.append(CallDelta(observation, generated, logprobs))
        naive.append(CallDelta(torch.cat([context, observation]), generated, logprobs))
        context = torch.cat([context, observation, generated])
    return deltas, naive


def storage_ratios(store: BlobStore) -> dict[str, dict[str, float]]:
    """Bytes and tokens stored, naive over delta, per call count (real puts into ``store``)."""
    by_bytes, by_tokens, sizes = {}, {}, {}
    for calls in CALL_COUNTS:
        deltas, naive = rollout_deltas(calls)
        stored = {}
        for name, records in (("delta", deltas), ("naive", naive)):
            capture_key = f"{name}-{calls}-{uuid.uuid4().hex[:8]}"
            refs = [
                store.put_delta(staging_key(capture_key, f"c{i}"), record)
                for i, record in enumerate(records)
            ]
            tokens = sum(record.delta_len for record in records)
            stored[name] = (sum(ref.size for ref in refs), tokens)
        by_bytes[str(calls)] = round(stored["naive"][0] / stored["delta"][0], 3)
        by_tokens[str(calls)] = round(stored["naive"][1] / stored["delta"][1], 3)
        sizes[str(calls)] = {"delta_bytes": stored["delta"][0], "naive_bytes": stored["naive"][0]}
    return {"bytes": by_bytes, "tokens": by_tokens, "sizes": sizes}


def _timed(operation: Callable[[], object]) -> float:
    start = time.perf_counter()
    operation()
    return time.perf_counter() - start


def throughput(store: BlobStore, blobs: list[bytes], rounds: int) -> dict[str, float]:
    """Ops/s of store put/get and raw fsspec put/get of ``blobs`` on the store's filesystem.

    Each store operation runs next to its raw twin (alternating which goes first), so that load
    from elsewhere on the machine falls on both alike; a rate is one over the mean time of one
    operation over all rounds, trimmed of the slowest and fastest tenth, so that a stall of the
    shared machine does not decide a ratio.
    """
    fs = store.fs
    times: dict[str, list[float]] = {"raw_put": [], "put": [], "raw_get": [], "get": []}
    for _ in range(rounds):
        run = uuid.uuid4().hex[:8]
        raw_paths = [store.path(f"raw/{run}/b{i}") for i in range(len(blobs))]
        fs.makedirs(raw_paths[0].rsplit("/", 1)[0], exist_ok=True)
        keys = [staging_key(f"bench-{run}", f"b{i}") for i in range(len(blobs))]
        refs: dict[int, BlobRef] = {}
        raw_put = partial(_durable_pipe, fs) if store.backend == "local" else fs.pipe_file
        for i, blob in enumerate(blobs):
            pair = [
                ("raw_put", partial(raw_put, raw_paths[i], blob)),
                ("put", partial(_put_into, refs, i, store, keys[i], blob)),
            ]
            for name, operation in pair if i % 2 else reversed(pair):
                times[name].append(_timed(operation))
        for i in range(len(blobs)):
            pair = [
                ("raw_get", partial(fs.cat_file, raw_paths[i])),
                ("get", partial(store.get, refs[i])),
            ]
            for name, operation in pair if i % 2 else reversed(pair):
                times[name].append(_timed(operation))
    result = {f"{name}_per_s": round(1 / _trimmed_mean(v), 1) for name, v in times.items()}
    result["put_over_raw"] = round(result["put_per_s"] / result["raw_put_per_s"], 3)
    result["get_over_raw"] = round(result["get_per_s"] / result["raw_get_per_s"], 3)
    return result


def _durable_pipe(fs: Any, path: str, blob: bytes) -> None:
    """A raw local ``pipe_file`` made durable as a local put is: the bytes, then the name."""
    fs.pipe_file(path, blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_directory(os.path.dirname(path))


def _trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    ordered = sorted(values)
    drop = int(len(ordered) * cut)
    return statistics.fmean(ordered[drop : len(ordered) - drop])


def _put_into(
    refs: dict[int, BlobRef], index: int, store: BlobStore, key: str, blob: bytes
) -> None:
    refs[index] = store.put(key, blob)


def gateway_call(seed: int = 0) -> tuple[list[int], list[int], list[float], list[dict[str, str]]]:
    """A typical gateway call's delta as its HTTP response has it: 60 new prompt tokens, 18
    generated tokens and their logprobs, and two short messages."""
    generator = torch.Generator().manual_seed(seed)
    prompt = _tokens(generator, 60).tolist()
    generated = _tokens(generator, 18).tolist()
    logprobs = (-torch.rand(18, generator=generator)).tolist()
    messages = [
        {"role": "user", "content": "What is the weather in Paris today?"},
        {"role": "assistant", "content": "Sunny, 21 degrees."},
    ]
    return prompt, generated, logprobs, messages


def _refuse(field: str, rule: str, got: object) -> None:
    raise InvalidDeltaError(field, rule, got)


def torch_save_encode(delta: CallDelta) -> bytes:
    """The baseline: ``encode_delta`` as it was before the codec's own encoder — its checks of a
    delta without routes or media in torch ops, then ``safetensors.torch.save``."""
    if delta.routes is not None or delta.media:
        raise ValueError("the baseline encodes deltas without routes or media")
    for field, tokens in (("prompt_delta", delta.prompt_delta), ("generated", delta.generated)):
        if tokens.dtype != torch.int32 or tokens.dim() != 1:
            _refuse(field, "must be one-dimensional torch.int32", tokens.dtype)
        if tokens.numel() and int(tokens.min()) < 0:
            _refuse(field, "must hold token ids >= 0", f"minimum {int(tokens.min())}")
    logprobs = delta.logprobs
    if logprobs.dtype != torch.float32 or logprobs.shape != delta.generated.shape:
        _refuse("logprobs", "must be float32, one per generated token", logprobs.shape)
    if nan := int(torch.isnan(logprobs).sum()):
        _refuse("logprobs", "must not be NaN", f"{nan} NaN value(s)")
    if positive_inf := int(torch.isposinf(logprobs).sum()):
        _refuse("logprobs", "must not be +inf", f"{positive_inf} +inf value(s)")
    tensors = {
        "prompt_delta": delta.prompt_delta,
        "generated": delta.generated,
        "logprobs": logprobs,
    }
    for index, message in enumerate(delta.messages or ()):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            _refuse(f"messages[{index}]", "must be a JSON object with a string role", message)
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    header: dict[str, Any] = {"codec": "grove.call-delta", "version": 1, "media": []}
    if delta.messages is not None:
        header["messages"] = list(delta.messages)
    grove = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return safetensors.torch.save(tensors, metadata={"grove": grove})


def _torch_save_put(store: BlobStore, key: str, delta: CallDelta) -> BlobRef:
    """The baseline's ``put_delta``: the key checked, ``torch_save_encode``, then ``put``."""
    return store.put(key, torch_save_encode(delta))


def _cpu(operation: Callable[[], object]) -> float:
    start = time.thread_time()
    operation()
    return time.thread_time() - start


def put_delta_cpu(store: BlobStore, rounds: int, puts: int) -> dict[str, float]:
    """CPU microseconds of ``put_delta`` of a typical gateway call's delta against the baseline
    (``torch_save_encode``, then ``put``), put by put in alternating order; the same for the
    encoding alone, and of ``CallDelta.from_lists`` (module docstring)."""
    prompt, generated, logprobs, messages = gateway_call()
    delta = CallDelta.from_lists(prompt, generated, logprobs, messages=messages)
    if encode_delta(delta) != torch_save_encode(delta):
        raise AssertionError("the codec's encoder and the baseline wrote different bytes")
    times: dict[str, list[float]] = {
        name: [] for name in ("put_delta", "torch_save_put", "encode", "torch_save_encode")
    }
    times["from_lists"] = []
    for round_ in range(rounds):
        run = f"cpu-{round_}-{uuid.uuid4().hex[:8]}"
        for i in range(puts):
            pair = [
                ("put_delta", partial(store.put_delta, staging_key(run, f"n{i}"), delta)),
                (
                    "torch_save_put",
                    partial(_torch_save_put, store, staging_key(run, f"b{i}"), delta),
                ),
            ]
            for name, operation in pair if i % 2 else reversed(pair):
                times[name].append(_cpu(operation))
            encodes = [
                ("encode", partial(encode_delta, delta)),
                ("torch_save_encode", partial(torch_save_encode, delta)),
            ]
            for name, operation in encodes if i % 2 else reversed(encodes):
                times[name].append(_cpu(operation))
            convert = partial(CallDelta.from_lists, prompt, generated, logprobs, messages=messages)
            times["from_lists"].append(_cpu(convert))
    result = {f"{name}_us": round(_trimmed_mean(v) * 1e6, 1) for name, v in times.items()}
    result["put_delta_cpu_over_torch_save"] = round(
        result["put_delta_us"] / result["torch_save_put_us"], 3
    )
    result["encode_cpu_over_torch_save"] = round(
        result["encode_us"] / result["torch_save_encode_us"], 3
    )
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_store() -> tuple[BlobStore, Callable[[], None]]:
    """A store on a moto S3 server in its own process (not competing for this one's GIL), and
    how to stop the server."""
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket="grove-bench")
            break
        except EndpointConnectionError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.1)
    store = open_blob_store(
        "s3://grove-bench/run",
        endpoint_url=endpoint,
        access_key_id="bench",
        secret_access_key="bench",
    )

    def stop() -> None:
        server.terminate()
        server.wait(timeout=10)

    return store, stop


def run(quick: bool) -> dict[str, Any]:
    """Every figure of this benchmark, as one JSON-ready dict."""
    rounds, local_blobs, s3_blobs = (3, 100, 40) if quick else (7, 400, 150)
    with tempfile.TemporaryDirectory(prefix="grove-bench-") as directory:
        local = open_blob_store(directory)
        ratios = storage_ratios(local)
        cpu = put_delta_cpu(local, rounds, local_blobs)
        deltas, _ = rollout_deltas(20, seed=1)
        payloads = [encode_delta(delta) for delta in deltas]
        backends = {"local": throughput(local, _repeat(payloads, local_blobs), rounds)}
        s3_store, stop = _moto_store()
        try:
            backends["s3"] = throughput(s3_store, _repeat(payloads, s3_blobs), rounds)
        finally:
            stop()
    return {
        "naive_over_delta_bytes": ratios["bytes"],
        "naive_over_delta_tokens": ratios["tokens"],
        "stored_bytes": ratios["sizes"],
        "put_over_raw": min(b["put_over_raw"] for b in backends.values()),
        "get_over_raw": min(b["get_over_raw"] for b in backends.values()),
        "blob_bytes": len(payloads[0]),
        "backends": backends,
        "put_delta_cpu_over_torch_save": cpu["put_delta_cpu_over_torch_save"],
        "put_delta_cpu": cpu,
        "quick": quick,
    }


def _repeat(payloads: list[bytes], count: int) -> list[bytes]:
    return [payloads[i % len(payloads)] for i in range(count)]


def _row(cells: list[object], widths: list[int]) -> str:
    return " ".join(
        f"{cell:>{width}.2f}" if isinstance(cell, float) else f"{cell!s:>{width}}"
        for cell, width in zip(cells, widths, strict=True)
    )


def _print_table(result: dict[str, Any]) -> None:
    widths = [6, 12, 12, 12, 12]
    print("Delta records against full-context storage (200 new tokens per call)")
    print(_row(["calls", "delta bytes", "naive bytes", "bytes ratio", "token ratio"], widths))
    for calls in map(str, CALL_COUNTS):
        sizes = result["stored_bytes"][calls]
        ratios = [result["naive_over_delta_bytes"][calls], result["naive_over_delta_tokens"][calls]]
        print(_row([calls, sizes["delta_bytes"], sizes["naive_bytes"], *ratios], widths))
    widths = [8, 9, 9, 8, 9, 9, 8]
    print(f"\nThroughput of {result['blob_bytes']}-byte delta blobs, ops/s (trimmed mean)")
    print(_row(["backend", "raw put", "put", "put/raw", "raw get", "get", "get/raw"], widths))
    for name, b in result["backends"].items():
        puts = [round(b["raw_put_per_s"]), round(b["put_per_s"]), b["put_over_raw"]]
        gets = [round(b["raw_get_per_s"]), round(b["get_per_s"]), b["get_over_raw"]]
        print(_row([name, *puts, *gets], widths))
    cpu = result["put_delta_cpu"]
    print("\nCPU per put of a typical gateway call's delta, us (trimmed mean; thread_time)")
    print(_row(["", "codec", "baseline", "ratio"], [8, 9, 9, 8]))
    for name, ours, baseline in (
        ("put", "put_delta", "torch_save_put"),
        ("encode", "encode", "torch_save_encode"),
    ):
        ratio = round(cpu[f"{ours}_us"] / cpu[f"{baseline}_us"], 3)
        print(_row([name, cpu[f"{ours}_us"], cpu[f"{baseline}_us"], ratio], [8, 9, 9, 8]))
    print(f"CallDelta.from_lists: {cpu['from_lists_us']} us")
    summary = f"put_over_raw {result['put_over_raw']}, get_over_raw {result['get_over_raw']}"
    print(f"\n{summary} (lower of the backends; aim >= 0.8)")


def main() -> None:
    """Run the benchmark; print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer blobs and rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.quick)
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)


if __name__ == "__main__":
    main()
