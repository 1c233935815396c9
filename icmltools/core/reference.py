"""The paper a method implements, as the JSON envelope's `reference` (stdlib only)."""
from __future__ import annotations


def paper(title: str, authors: str, *, arxiv: str | None = None, url: str | None = None,
          venue: str = "ICML 2025", code: str | None = None) -> dict:
    """A reference record: title, authors, venue, arXiv id and links (official code where public)."""
    ref = {"title": title, "authors": authors, "venue": venue}
    if arxiv:
        ref["arxiv"] = arxiv
        ref["url"] = url or f"https://arxiv.org/abs/{arxiv}"
    elif url:
        ref["url"] = url
    if code:
        ref["code"] = code
    return ref
