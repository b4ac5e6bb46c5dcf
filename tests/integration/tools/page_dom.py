"""Read back what a ``grove show`` page holds: graph nodes, rows and their tokens, outside links."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class PageRow:
    """One reconstructed row: its index, calls (root to endpoint) and tokens as (kind, title)."""

    index: int
    call_ids: list[str]
    tokens: list[tuple[str, str]] = field(default_factory=list)


class PageDom(HTMLParser):
    """The graph's nodes (call id -> classes), the rows, and every attribute that could fetch."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.nodes: dict[str, set[str]] = {}
        self.rows: list[PageRow] = []
        self.fetches: list[str] = []
        self.svg_ids: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        for name in ("src", "href", "xlink:href"):
            if a.get(name):
                self.fetches.append(f"<{tag} {name}={a[name]}>")
        if tag == "link":
            self.fetches.append(f"<link {a}>")
        if tag == "svg" and a.get("id"):
            self.svg_ids.append(a["id"])
        if tag == "g" and "node" in classes and a.get("data-call"):
            self.nodes[a["data-call"]] = classes
        if tag == "section" and "row" in classes:
            self.rows.append(PageRow(int(a["data-row"]), (a.get("data-calls") or "").split()))
        if tag == "span" and "tok" in classes and self.rows:
            (kind,) = classes - {"tok"}
            self.rows[-1].tokens.append((kind, a.get("title") or ""))
