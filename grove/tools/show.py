"""``grove show --html``: one self-contained page with an attempt's capture graph and its rows.

The picture (``docs/debugging.md``, "grove show") draws
the capture graph as an SVG — roots and continuations (shape), selected, rejected, failed and
pending calls (fill), the selection order, endpoints (double ring) and the scored terminal (star),
with a legend — and the reconstructed rows below it, one token per box: context (prompts,
observations, rewritten inputs), loss (generated tokens this row owns) and unowned (generated
tokens an earlier row owns, carried here as context); an image's placeholder tokens are one box
naming the image and its patch grid (``docs/media.md``). Hovering a token shows its decoded text,
id, position, call and logprob; hovering a call highlights it in the graph and in every row.
Below the calls table, each root the splice's boundary check made shows its divergence diagnostic
(message, offsets, both token windows, likely cause: ``capture/divergence.py``), also in its
node's tooltip.

The graph comes from ``grove.tools.lineage`` (the lineage views); the rows are rebuilt from the
blobs with the projector's own code (``grove.training.projector.finalization_forest``) on the state
the projector saw when it recorded ``rollout.finalized`` (or the current state, before that). Tokens
are decoded with the embedded tokenizer when the attempt was recorded with the embedded model;
for another model the page shows token ids. Inline CSS and JavaScript, nothing fetched.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from grove.capture.divergence import Divergence
from grove.capture.embedded import EMBEDDED_MODEL_NAME, build_tokenizer
from grove.capture.embedded_moe import EMBEDDED_MOE_MODEL_NAME
from grove.ledger.event_replay import state_before
from grove.ledger.events import AttemptOpened, RolloutFinalized
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import BlobStore
from grove.tools.lineage import AttemptLineage, CallLineage, attempt_events, attempt_lineages
from grove.tools.tree_view import tree_section
from grove.training.errors import TrainingError
from grove.training.finalization import recorded_media_rules
from grove.training.forest import Forest, ForestRow
from grove.training.projector import finalization_forest
from grove.training.rows import MediaItem

__all__ = ["AttemptPage", "render_page", "write_attempt_page"]

Decode = Callable[[int], str]

_ROW_COLORS = ("#d62728", "#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c", "#8c564b", "#e377c2")
_DX, _DY, _R, _LEFT, _TOP = 110, 90, 18, 60, 60


@dataclass(frozen=True)
class AttemptPage:
    """What ``write_attempt_page`` wrote: the file, and how many calls and rows it shows."""

    path: Path
    calls: int
    rows: int


def _lanes(calls: Sequence[CallLineage]) -> dict[str, int]:
    """A lane per chain: a root opens one; a continuation stays in its parent's lane unless an
    earlier child took it (a retry or a branch opens a new lane)."""
    lanes: dict[str, int] = {}
    extended: set[str] = set()
    for call in calls:
        parent = call.parent_call_id
        if parent in lanes and parent not in extended:
            lanes[call.call_id] = lanes[parent]
            extended.add(parent)
        else:
            lanes[call.call_id] = max(lanes.values(), default=-1) + 1
    return lanes


def _kind(call: CallLineage) -> str:
    """The fill class of a node: selected, rejected (committed, not selected), failed, pending."""
    if call.late or call.status == "pending":
        return "pending"
    if call.status == "failed":
        return "failed"
    return "selected" if call.selected else "rejected"


def _node_title(call: CallLineage) -> str:
    lines = [
        f"{call.call_id}: {call.decision}"
        + (f" ({call.root_reason})" if call.root_reason else f" of {call.parent_call_id}"),
        f"status {call.status}" + (" (late)" if call.late else ""),
    ]
    if call.failure_reason:
        lines.append(f"failure {call.failure_reason}")
    lines.append(f"selected #{call.selection_index}" if call.selected else "not selected (no loss)")
    if call.endpoint:
        lines.append("endpoint of the selected forest")
    if call.terminal:
        lines.append("scored terminal")
    if call.rows:
        owner = f"; loss in row {call.owner_row}" if call.owner_row is not None else ""
        lines.append(f"rows {', '.join(map(str, call.rows))}{owner}")
    if call.masked_reason:
        lines.append(f"masked: {call.masked_reason}")
    if call.cum_len is not None:
        lines.append(
            f"prev_len {call.prev_len} + delta_len {call.delta_len} = cum_len {call.cum_len}; "
            f"{call.generated_len} generated"
        )
    if call.divergence is not None:
        lines.append(_divergence_text(call.divergence))
    return "\n".join(lines)


def _divergence_text(divergence: dict[str, Any]) -> str:
    return Divergence.from_payload(divergence).describe()


def _graph_svg(lineage: AttemptLineage) -> str:
    calls = lineage.calls
    lanes = _lanes(calls)
    at = {c.call_id: (_LEFT + i * _DX, _TOP + lanes[c.call_id] * _DY) for i, c in enumerate(calls)}
    width = _LEFT * 2 + max(len(calls) - 1, 0) * _DX
    height = _TOP + max(lanes.values(), default=0) * _DY + 70
    parts = [
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="capture graph">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#666"/></marker></defs>',
    ]
    by_id = {c.call_id: c for c in calls}
    for call in calls:
        if call.parent_call_id not in at:
            continue
        (x1, y1), (x2, y2) = at[call.parent_call_id], at[call.call_id]
        x1, x2 = x1 + _R, x2 - _R - (10 if call.endpoint else 4)
        mid = (x1 + x2) / 2
        both = call.selected and by_id[call.parent_call_id].selected
        parts.append(
            f'<path class="edge{" sel" if both else ""}" data-call="{html.escape(call.call_id)}" '
            f'd="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}" marker-end="url(#arrow)"/>'
        )
    for call in calls:
        x, y = at[call.call_id]
        cid = html.escape(call.call_id)
        classes = ["node", _kind(call), call.decision]
        if call.selected:
            classes.append("is-selected")
        if call.endpoint:
            classes.append("endpoint")
        parts.append(
            f'<g class="{html.escape(" ".join(classes))}" data-call="{cid}" '
            f'transform="translate({x},{y})">'
            f"<title>{html.escape(_node_title(call))}</title>"
        )
        if call.endpoint:
            parts.append(f'<circle class="ring" r="{_R + 6}"/>')
        if call.decision == "root":
            parts.append(
                f'<rect class="shape" x="{-_R}" y="{-_R}" width="{2 * _R}" height="{2 * _R}" '
                'rx="5"/>'
            )
        else:
            parts.append(f'<circle class="shape" r="{_R}"/>')
        if _kind(call) in ("rejected", "failed"):
            d = _R * 0.45
            parts.append(f'<path class="cross" d="M{-d},{-d} L{d},{d} M{d},{-d} L{-d},{d}"/>')
        if call.selected:
            parts.append(f'<text class="index" y="5">{call.selection_index}</text>')
        if call.terminal:
            parts.append(f'<text class="star" x="{_R - 2}" y="{-_R + 2}">★</text>')
        parts.append(f'<text class="label" y="{_R + 16}">{cid}</text>')
        if call.rows:
            chips = " ".join(
                f'<tspan fill="{_ROW_COLORS[r % len(_ROW_COLORS)]}">r{r}</tspan>' for r in call.rows
            )
            parts.append(f'<text class="chips" y="{_R + 30}">{chips}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


_LEGEND = """
<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="930" height="44">
 <g class="node selected root" transform="translate(20,22)"><rect class="shape" x="-12" y="-12"
  width="24" height="24" rx="4"/></g><text x="38" y="26">root</text>
 <g class="node selected continuation" transform="translate(95,22)"><circle class="shape"
  r="12"/></g><text x="113" y="26">continuation</text>
 <g class="node selected is-selected continuation" transform="translate(215,22)"><circle
  class="shape" r="12"/><text class="index" y="4">2</text></g>
  <text x="233" y="26">selected (order)</text>
 <g class="node rejected continuation" transform="translate(360,22)"><circle class="shape"
  r="12"/><path class="cross" d="M-5,-5 L5,5 M5,-5 L-5,5"/></g>
  <text x="378" y="26">rejected / not selected</text>
 <g class="node failed continuation" transform="translate(545,22)"><circle class="shape"
  r="12"/><path class="cross" d="M-5,-5 L5,5 M5,-5 L-5,5"/></g><text x="563" y="26">failed</text>
 <g class="node pending continuation" transform="translate(625,22)"><circle class="shape"
  r="12"/></g><text x="643" y="26">pending / late</text>
 <g class="node selected endpoint continuation" transform="translate(755,22)"><circle
  class="ring" r="16"/><circle class="shape" r="10"/></g><text x="777" y="26">endpoint</text>
 <text class="star" x="835" y="27">★</text><text x="850" y="26">terminal</text>
</svg>
"""


def _image_cell(item: MediaItem, start: int) -> str:
    """One box for an image's placeholder tokens (``docs/media.md``)."""
    title = (
        f"#{start}-{start + item.token_end - item.token_start - 1} {item.kind} {item.media_id}: "
        f"{item.token_end - item.token_start} placeholder tokens, "
        f"{item.frames}x{item.height}x{item.width} patches"
    )
    return (
        f'<span class="tok img" title="{html.escape(title)}">▣ {html.escape(item.media_id)}</span>'
    )


def _token_cells(
    row: ForestRow, decode: Decode | None, media: Mapping[str, Sequence[MediaItem]]
) -> str:
    cells = []
    for segment in row.segments:
        cid = html.escape(segment.call_id)
        cells.append(f'<span class="seg" data-call="{cid}"><span class="seglabel">{cid}</span>')
        images = {segment.start + m.token_start: m for m in media.get(segment.call_id, ())}
        skip_to = segment.start
        for position in range(segment.start, segment.end):
            if position < skip_to:
                continue  # inside an image drawn as one box
            if position in images:
                item = images[position]
                cells.append(_image_cell(item, position))
                skip_to = position + item.token_end - item.token_start
                continue
            token = row.token_ids[position]
            generated = position >= segment.generated_start
            if not generated:
                kind, what = "ctx", "context (prompt or observation)"
            elif segment.owned:
                kind, what = "loss", f"generated, loss here, logprob {row.logprobs[position]:.4f}"
            else:
                kind, what = "unowned", "generated, owned by an earlier row (context here)"
            text = decode(token) if decode else str(token)
            title = f"#{position} id {token} {text!r}\n{segment.call_id}: {what}"
            shown = text.replace("\n", "⏎") or "∅"
            cells.append(
                f'<span class="tok {kind}" title="{html.escape(title)}">{html.escape(shown)}</span>'
            )
        cells.append("</span>")
    return "".join(cells)


def _rows_html(
    forest: Forest | None,
    decode: Decode | None,
    note: str,
    media: Mapping[str, Sequence[MediaItem]],
) -> str:
    if forest is None:
        return f'<p class="note">{html.escape(note)}</p>'
    if not forest.trainable:
        masked = f"masked: {forest.masked_reason}. {note}"
        return f'<p class="note">{html.escape(masked)}</p>'
    parts = [f'<p class="note">{html.escape(note)}</p>'] if note else []
    for index, row in enumerate(forest.rows):
        color = _ROW_COLORS[index % len(_ROW_COLORS)]
        loss = sum(row.loss_mask)
        parts.append(
            f'<section class="row" id="row-{index}" data-row="{index}" '
            f'data-calls="{html.escape(" ".join(row.call_ids))}">'
            f'<h3><span class="swatch" style="background:{color}"></span>row {index}: '
            f"{html.escape(' → '.join(row.call_ids))} · owns "
            f"{html.escape(', '.join(row.owned_call_ids) or 'nothing')} · "
            f"{len(row.token_ids)} tokens, {loss} with loss</h3>"
            f'<div class="tokens">{_token_cells(row, decode, media)}</div></section>'
        )
    return "".join(parts)


def _calls_table(lineage: AttemptLineage) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("call", "parent", "decision", "status", "selected", "rows", "tokens")
    )
    body = []
    for c in lineage.calls:
        decision = c.decision + (f" ({c.root_reason})" if c.root_reason else "")
        status = c.status + (" late" if c.late else "")
        status += f" ({c.failure_reason})" if c.failure_reason else ""
        selected = "" if c.selection_index is None else f"#{c.selection_index}"
        selected += " endpoint" if c.endpoint else ""
        selected += " terminal" if c.terminal else ""
        rows = ", ".join(map(str, c.rows))
        tokens = "" if c.cum_len is None else f"{c.prev_len}+{c.delta_len}={c.cum_len}"
        cells = (c.call_id, c.parent_call_id or "", decision, status, selected, rows, tokens)
        body.append(
            f'<tr data-call="{html.escape(c.call_id)}">'
            + "".join(f"<td>{html.escape(v)}</td>" for v in cells)
            + "</tr>"
        )
    return f'<table class="calls"><tr>{head}</tr>{"".join(body)}</table>'


def _divergences_html(lineage: AttemptLineage) -> str:
    """One block per root the boundary check made: the call, its reason and its divergence."""
    blocks = [
        f'<section class="divergence" data-call="{html.escape(c.call_id)}">'
        f"<h3>{html.escape(c.call_id)}: root ({html.escape(str(c.root_reason))})</h3>"
        f"<pre>{html.escape(_divergence_text(c.divergence))}</pre></section>"
        for c in lineage.calls
        if c.divergence is not None
    ]
    if not blocks:
        return ""
    return "<h2>Divergences</h2>" + "".join(blocks)


_PAGE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Grove · $title</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
h3 { font-size: 13px; font-weight: 600; margin: 12px 0 4px; }
.meta { color: #555; } .note { color: #8a5a00; } .graph { overflow-x: auto; }
.edge { fill: none; stroke: #999; stroke-width: 1.5; stroke-dasharray: 4 3; }
.edge.sel { stroke: #333; stroke-width: 2.2; stroke-dasharray: none; }
.node .shape { stroke: #555; stroke-width: 1.5; }
.node.selected .shape { fill: #4c78a8; }
.node.selected.continuation .shape { fill: #59a89c; }
.node.rejected .shape { fill: #d0ccc8; }
.node.failed .shape { fill: #e45756; }
.node.pending .shape { fill: #fff; stroke-dasharray: 3 2; }
.node.is-selected .shape { stroke: #111; stroke-width: 3; }
.node .ring { fill: none; stroke: #111; stroke-width: 1.5; }
.node .cross { stroke: #333; stroke-width: 2; }
.node .index { fill: #fff; font: bold 13px sans-serif; text-anchor: middle; }
.star { fill: #e6a700; font-size: 18px; }
.node .label { font: 12px monospace; text-anchor: middle; fill: #222; }
.node .chips { font: 10px monospace; text-anchor: middle; fill: #555; }
.legend text { font-size: 12px; fill: #333; }
.hl .shape, .node.hl .shape { stroke: #e6a700 !important; stroke-width: 4 !important; }
.tokens { font: 12px/1.9 monospace; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.seg { border-left: 2px solid #777; padding-left: 2px; margin-right: 3px; }
.seg.hl { background: #fff3c4; }
.seglabel { font: 10px sans-serif; color: #555; vertical-align: super; margin-right: 2px; }
.tok { display: inline-block; white-space: pre; border: 1px solid #bbb; border-radius: 3px;
  padding: 0 2px; margin: 1px 1px; min-width: 6px; }
.tok.ctx { background: #eceff3; color: #444; }
.tok.loss { background: #b7e4b0; border-color: #4a9a3f; }
.tok.unowned { background: #ffe0a8; border-color: #d69a2d; }
.tok.img { background: #e2d6f5; border-color: #7a5cb0; }
.key span.tok { cursor: default; }
table.calls { border-collapse: collapse; font-size: 12px; }
table.calls td, table.calls th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
table.calls tr.hl { background: #fff3c4; }
.divergence pre { font: 12px/1.4 monospace; background: #fbf7ea; padding: 6px; overflow-x: auto; }
.divergence.hl pre { background: #fff3c4; }
</style></head>
<body>
<h1>Attempt $capture_key</h1>
<p class="meta">$meta</p>
<h2>Capture graph</h2>
$legend
<div class="graph">$graph</div>
<h2>Training rows</h2>
<p class="key">tokens: <span class="tok ctx">context</span> <span class="tok loss">loss</span>
<span class="tok unowned">unowned (generated, owned by an earlier row)</span>
<span class="tok img">▣ image (its placeholder tokens)</span>
— hover a token for its text, id and logprob.</p>
<div id="rows">$rows</div>
$tree
<h2>Calls</h2>
$calls
$divergences
<script>
for (const el of document.querySelectorAll("[data-call]")) {
  const id = el.getAttribute("data-call");
  const same = () => document.querySelectorAll('[data-call="' + CSS.escape(id) + '"]');
  el.addEventListener("mouseenter", () => same().forEach(e => e.classList.add("hl")));
  el.addEventListener("mouseleave", () => same().forEach(e => e.classList.remove("hl")));
}
for (const row of document.querySelectorAll("section.row")) {
  const nodes = row.getAttribute("data-calls").split(" ").map(
    id => document.querySelector('#graph .node[data-call="' + CSS.escape(id) + '"]'));
  row.addEventListener("mouseenter", () => nodes.forEach(n => n && n.classList.add("hl")));
  row.addEventListener("mouseleave", () => nodes.forEach(n => n && n.classList.remove("hl")));
}
</script>
</body></html>
""")


def _meta(lineage: AttemptLineage) -> str:
    parts = [
        f"rollout {lineage.rollout_id}",
        f"group {lineage.prompt_group}",
        f"selection policy {lineage.selection_policy}",
    ]
    rollout = lineage.rollout
    if rollout is None:
        parts.append("no selection recorded")
    else:
        parts.append(f"reward {rollout['reward']:g}")
        status = rollout["status"]
        if rollout["masked_reason"]:
            status += f" ({rollout['masked_reason']})"
        parts.append(status)
        if rollout["step"] is not None:
            parts.append(f"trained at step {rollout['step']}")
    return html.escape(" · ".join(parts))


def render_page(
    lineage: AttemptLineage,
    forest: Forest | None,
    decode: Decode | None,
    note: str = "",
    media: Mapping[str, Sequence[MediaItem]] | None = None,
) -> str:
    """The page for ``lineage`` and its rebuilt ``forest`` (None: no rows to show, ``note``
    says why); ``decode`` turns a token id into its text (None: show ids); ``media`` maps call
    ids to their images, each drawn as one box over its placeholder tokens."""
    return _PAGE.substitute(
        title=html.escape(lineage.capture_key),
        capture_key=html.escape(lineage.capture_key),
        meta=_meta(lineage),
        legend=_LEGEND,
        graph=_graph_svg(lineage),
        rows=_rows_html(forest, decode, note, media or {}),
        tree=tree_section(forest, decode),
        calls=_calls_table(lineage),
        divergences=_divergences_html(lineage),
    )


def _decoder(opened: AttemptOpened) -> Decode | None:
    if opened.model_fingerprint not in (EMBEDDED_MODEL_NAME, EMBEDDED_MOE_MODEL_NAME):
        return None  # the embedded models share one tokenizer
    tokenizer = build_tokenizer()
    return lambda token: str(tokenizer.decode([token]))  # one list of ids: one string


def _decision_settings(finalized: list[StoredEvent], opened: AttemptOpened) -> dict[str, Any]:
    """The settings the projector decided the rollout under (recorded with its decision), or
    before a decision the attempt's own forest mode and no length limit."""
    decision = finalized[0].decode() if finalized else None
    if isinstance(decision, RolloutFinalized):
        return {
            "forest_training": decision.forest_training,
            "max_row_tokens": decision.max_row_tokens,
            "media_rules": recorded_media_rules(decision),
        }
    return {"forest_training": opened.forest_mode, "max_row_tokens": None, "media_rules": None}


def write_attempt_page(store: EventStore, blobs: BlobStore, key: str, path: Path) -> AttemptPage:
    """Write the page of the attempt ``key`` names to ``path`` (written last, whole)."""
    capture_key, events = attempt_events(store, key)
    (lineage,) = [a for a in attempt_lineages(store, capture_key) if a.capture_key == capture_key]
    opened = events[0].decode_as(AttemptOpened)
    finalized = [s for s in events if s.event_type == RolloutFinalized.type]
    cutoff = finalized[0].position if finalized else events[-1].position + 1
    state = state_before(capture_key, events, cutoff)
    forest, note = None, "no selection is recorded yet, so there are no rows"
    media: dict[str, Sequence[MediaItem]] = {}
    if state.selection is not None:
        note = "rows rebuilt from the blobs as the projector decided them"
        if not finalized:
            note = "not finalized yet: rows as the projector would rebuild them now"
        try:
            forest, extras = finalization_forest(
                state, blobs, **_decision_settings(finalized, opened)
            )
            media = {call_id: extra.media for call_id, extra in extras.items() if extra.media}
        except TrainingError as error:
            forest, note = None, f"the rows cannot be rebuilt: {error}"
    decode = _decoder(opened)
    if decode is None:
        note += f" (model {opened.model_fingerprint}: tokens shown as ids)"
    page = render_page(lineage, forest, decode, note, media)
    path.write_text(page, encoding="utf-8")
    rows = len(forest.rows) if forest is not None else 0
    return AttemptPage(path, len(lineage.calls), rows)
