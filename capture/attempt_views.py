"""The capture service's memory of each attempt: its folded state, admission index and chain caches.

An ``AttemptView`` holds one attempt as the service last knew it: the folded ``AttemptState``, the
admission index of its committed calls (``ledger/admission.py``), and, per committed call, the
exact tokens, output texts and media of its whole chain (root first). ``AttemptViews`` keeps the
views of the most recently used attempts (least recently used dropped first) and brings a view up
to date by reading only the events after the version it has, so admitting a call costs the same
at call 1,000 as at call 10.

Locking: the ledger is read outside every lock; the cache of views has one lock, and each view
its own, under which the events read are folded (only those after the version the view has
reached, so concurrent readers of one attempt may read overlapping events harmlessly). Calls of
different attempts therefore never wait for each other.

A chain absent from the caches (a call committed by another process, or a view rebuilt after
eviction) is read from its blobs, digests verified, once, and cached. The service folds its own
appends into the view as they land (``fold_own``) and records each committed call's chain
(``remember``), so a call planned against the view reads nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from grove.capture.media import chain_media
from grove.capture.render import Renderer
from grove.capture.splice import RawOutput
from grove.ledger.admission import AdmissionIndex
from grove.ledger.attempt import (
    AttemptError,
    AttemptLog,
    AttemptState,
    CallStatus,
    fold_attempt,
    index_call_event,
)
from grove.ledger.events import CallCommitted, CallIntended
from grove.storage import BlobRef, BlobStore, MediaDescriptor

__all__ = ["DEFAULT_CACHED_VIEWS", "AttemptView", "AttemptViews", "committed_parent"]

DEFAULT_CACHED_VIEWS = 4096
"""How many attempts' views a capture service keeps by default."""


def committed_parent(state: AttemptState, call_id: str) -> CallCommitted:
    """The commit of ``call_id``, a parent admission picked (it picks committed calls only)."""
    call = state.calls[call_id]
    if call.committed is None or call.status is not CallStatus.COMMITTED:
        raise AttemptError(
            state.capture_key, f"a parent must be committed, but is {call.status.value}", call_id
        )
    return call.committed


@dataclass
class AttemptView:
    """One attempt as the service knows it (producer and consumer: ``AttemptViews``).

    ``chains[c]`` is the exact token sequence of call ``c``'s chain (every ancestor's delta and
    generation, then its own); ``outputs[c]`` the output texts of that chain, root first;
    ``media[c]`` its media in chain coordinates, present only for chains that hold any. Fields
    change only under ``lock``.
    """

    state: AttemptState
    index: AdmissionIndex
    chains: dict[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: dict[str, tuple[RawOutput, ...]] = field(default_factory=dict)
    media: dict[str, tuple[MediaDescriptor, ...]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class AttemptViews:
    """The views of the ``capacity`` most recently used attempts, over one log and blob store."""

    def __init__(
        self, log: AttemptLog, blobs: BlobStore, renderer: Renderer, *, capacity: int
    ) -> None:
        self.log = log
        self.blobs = blobs
        self.renderer = renderer
        self.capacity = capacity
        self._views: OrderedDict[str, AttemptView] = OrderedDict()
        self._lock = threading.Lock()  # guards _views only; each view has its own lock

    def view(self, capture_key: str, *, read: bool = True) -> AttemptView:
        """The attempt's state and admission index, updated from the events not yet seen
        (``read=False``: as last read, unless no view of it is held yet)."""
        with self._lock:
            view = self._views.get(capture_key)
            if view is None:
                view, read = self._new_view(capture_key), True
            self._views.move_to_end(capture_key)
        if not read:
            return view
        # Read outside every lock; concurrent readers of one attempt may read overlapping
        # events, and each folds only those after the version the view has reached.
        stored = self.log.store.read_stream(capture_key, after_version=view.state.version)
        with view.lock:
            fresh = [s.decode() for s in stored if s.stream_version > view.state.version]
            opening = view.state.opened is None
            view.state = fold_attempt(capture_key, fresh, view.state)
            if opening:
                self._index_fork_source(view)
            for event in fresh:
                index_call_event(view.index, view.state, event)
            self.log.keep(view.state)  # the log's next append expects this version, unread
        return view

    def _new_view(self, capture_key: str) -> AttemptView:
        """An empty view of the attempt, held as the most recently used (the least recently
        used dropped beyond capacity); the caller holds the cache's lock."""
        view = self._views[capture_key] = AttemptView(AttemptState(capture_key), AdmissionIndex())
        while len(self._views) > self.capacity:
            self._views.popitem(last=False)
        return view

    def _index_fork_source(self, view: AttemptView) -> None:
        """Index a fork's source call as a parent candidate of the fork's calls (its commit's
        replay summary), once the view first holds the opening: a request that extends the
        source conversation then continues it. Nothing for an attempt that forks nothing."""
        opened = view.state.opened
        if opened is not None and opened.fork_from is not None:
            view.index.add(opened.fork_from.candidate())

    def owner(self, view: AttemptView, call_id: str) -> AttemptView:
        """The view of the attempt that owns ``call_id`` as a parent of ``view``'s calls: the
        fork source's attempt for the call the attempt forks, ``view`` itself otherwise."""
        if call_id in view.state.calls or view.state.opened is None:
            return view
        fork = view.state.opened.fork_from
        if fork is None or fork.source_call_id != call_id:
            return view
        return self.view(fork.source_capture_key)

    def adopt(self, capture_key: str) -> None:
        """Take the log's state after the service's own attempt-level append (opened, closed,
        settled, selected) into the attempt's view when the two differ by no call: the view's
        admission index, built from call events alone, then stays exact, and the next request
        finds the view current without reading. An attempt with no view yet whose state holds
        no call (one just opened) gets its view from that state. Otherwise the view stays as it
        is, and is read when next needed."""
        held = self.log.held(capture_key)
        if held is None:
            return
        with self._lock:
            view = self._views.get(capture_key)
            if view is None and not held.calls:
                view = self._new_view(capture_key)
        if view is None:
            return
        with view.lock:
            if held.version > view.state.version and held.calls == view.state.calls:
                opening = view.state.opened is None
                view.state = held
                if opening:
                    self._index_fork_source(view)

    @staticmethod
    def fold_own(view: AttemptView, version: int, event: CallIntended | CallCommitted) -> None:
        """Fold the service's own append, landed at ``version``, into the view when the view is
        at the version just before it (otherwise the next call reads what it missed)."""
        with view.lock:
            if view.state.version == version - 1:
                view.state = fold_attempt(view.state.capture_key, [event], view.state)
                index_call_event(view.index, view.state, event)

    def remember(
        self,
        view: AttemptView,
        call_id: str,
        parent_call_id: str | None,
        *,
        tokens: tuple[int, ...],
        output: RawOutput,
        media: Sequence[MediaDescriptor],
        prev_len: int,
    ) -> None:
        """Cache a call the service just committed: ``tokens`` its whole chain's, ``output`` its
        own text, ``media`` the media its delta stored (delta coordinates, after ``prev_len``)."""
        parent_outputs = self.parent_outputs(view, parent_call_id)
        parent_media = self.chain_media(view, parent_call_id)
        with view.lock:
            view.chains[call_id] = tokens
            view.outputs[call_id] = (*parent_outputs, output)
            if media or parent_media:
                view.media[call_id] = chain_media(parent_media, list(media), prev_len)

    def chain_tokens(self, view: AttemptView, call_id: str) -> tuple[int, ...]:
        """The exact tokens of ``call_id``'s chain: every ancestor's delta and generation."""
        view = self.owner(view, call_id)
        cached = view.chains.get(call_id)
        if cached is None:
            self._load_chain(view, call_id)
            cached = view.chains[call_id]
        return cached

    def parent_outputs(self, view: AttemptView, call_id: str | None) -> tuple[RawOutput, ...]:
        """The exact output texts of ``call_id``'s chain, root first (none for no call)."""
        if call_id is None:
            return ()
        view = self.owner(view, call_id)
        cached = view.outputs.get(call_id)
        if cached is None:
            self._load_chain(view, call_id)
            cached = view.outputs[call_id]
        return cached

    def chain_media(self, view: AttemptView, call_id: str | None) -> tuple[MediaDescriptor, ...]:
        """The media of ``call_id``'s chain in chain coordinates, root first (none for none)."""
        if call_id is None:
            return ()
        view = self.owner(view, call_id)
        if call_id not in view.chains:
            self._load_chain(view, call_id)
        return view.media.get(call_id, ())

    def parent_chain_digest(self, view: AttemptView, parent_call_id: str | None) -> str | None:
        """The chain digest recorded by the parent's commit (None for a root)."""
        if parent_call_id is None:
            return None
        return committed_parent(self.owner(view, parent_call_id).state, parent_call_id).chain_digest

    def source_capture_key(self, view: AttemptView, parent_call_id: str | None) -> str | None:
        """The attempt that owns ``parent_call_id`` when it is not ``view``'s (a fork's source),
        None otherwise."""
        if parent_call_id is None:
            return None
        owner = self.owner(view, parent_call_id)
        return None if owner is view else owner.state.capture_key

    def _load_chain(self, view: AttemptView, call_id: str) -> None:
        """Read ``call_id``'s chain from its blobs (digests verified) into the view's caches."""
        committed = committed_parent(view.state, call_id)
        parent = view.state.calls[call_id].parent_call_id
        source = view.state.calls[call_id].intended.source_capture_key
        parent_view = view if source is None else self.view(source)
        delta = self.blobs.get_delta(
            BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        )
        generated = delta.generated.tolist()
        content = generated if committed.finish_reason == "length" else generated[:-1]
        output = RawOutput(committed.replay_summary.item_count - 1, self.renderer.decode(content))
        parent_tokens = () if parent is None else self.chain_tokens(parent_view, parent)
        view.chains[call_id] = (*parent_tokens, *delta.prompt_delta.tolist(), *generated)
        view.outputs[call_id] = (*self.parent_outputs(parent_view, parent), output)
        own_media = [item.descriptor for item in delta.media]
        if own_media or parent in parent_view.media:
            view.media[call_id] = chain_media(
                self.chain_media(parent_view, parent), own_media, committed.prev_len
            )
