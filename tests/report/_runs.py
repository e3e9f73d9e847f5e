"""Small run directories for the report's tests, written by the real ``ResultsWriter``
(so the assets are ``assets/<hash>.png`` exactly as a run stores them), and a parser of
the pages' markup."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from PIL import Image

from vf_mm.results import ResultsWriter
from vf_mm.types import RolloutError, RolloutOutput

COLOURS = [(220, 30, 30), (30, 60, 220), (20, 160, 60), (240, 200, 20), (120, 40, 160)]


def image(i: int) -> Image.Image:
    """Distinct image ``i``: a flat colour, a size of its own."""
    return Image.new("RGB", (40 + 8 * i, 30 + 4 * i), COLOURS[i % len(COLOURS)])


def write_run(
    root: Path,
    n: int,
    *,
    distinct: int = 3,
    error_every: int = 0,
    finish: bool = True,
) -> list[dict[str, Any]]:
    """A run of ``n`` rollouts (2 per example) cycling over ``distinct`` images, every
    ``error_every``-th one failed; ``finish`` stores the aggregates in metadata.json.
    Returns the rows as written."""
    rows = []
    with ResultsWriter(root, metadata={"config": {"env_id": "pages", "model": "tiny"}}) as writer:
        for i in range(n):
            example, rollout = divmod(i, 2)
            failed = bool(error_every) and i % error_every == 0
            prompt = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"rollout {i}: what colour?"},
                        {"type": "image", "image": image(i % distinct)},
                    ],
                }
            ]
            completion = [] if failed else [{"role": "assistant", "content": f"answer {i}"}]
            output = RolloutOutput(
                example,
                prompt,
                completion,
                reward=None if failed else float(i % 3) / 2,
                metrics={} if failed else {"correct": float(i % 2)},
                error=RolloutError("BackendUnavailableError", f"refused {i}", "turn 1")
                if failed
                else None,
            )
            rows.append(writer.write(output, rollout_index=rollout))
        if finish:
            writer.finalize()
    return rows


_VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "source", "wbr"})


class Page(HTMLParser):
    """Elements (tag, attrs) and text of one HTML file, as a browser's parser sees them."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.script_text: list[str] = []
        self._stack: list[str] = []
        self.feed(html)
        self.close()

    @classmethod
    def of(cls, path: Path) -> Page:
        return cls(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag not in _VOID:
            self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self._stack:
            while self._stack.pop() != tag:
                pass

    def handle_data(self, data):
        if self._stack and self._stack[-1] == "script":
            self.script_text.append(data)
        else:
            self.text.append(data)

    def having(self, cls: str, tag: str | None = None) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.elements
            if (tag is None or t == tag) and cls in (a.get("class") or "").split()
        ]

    def tags(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == tag]

    @property
    def all_text(self) -> str:
        return "".join(self.text)

    @property
    def csp(self) -> str:
        (csp,) = [
            a["content"]
            for a in self.tags("meta")
            if a.get("http-equiv") == "Content-Security-Policy"
        ]
        assert csp is not None
        return csp

    @property
    def card_ids(self) -> list[str]:
        return [str(a["id"]) for a in self.having("card", "article")]


def card_orders(page: Page) -> list[int]:
    """The 0-based positions of the rollouts a page shows (its cards' ``r<order>`` ids)."""
    return [int(re.fullmatch(r"r(\d+)", i).group(1)) for i in page.card_ids]  # type: ignore[union-attr]
