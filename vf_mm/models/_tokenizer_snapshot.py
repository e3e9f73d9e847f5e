"""``TokenizerSnapshot``: a checkpoint's loaded tokenizer, pickled once, copied cheaply.

Loading a large tokenizer from its checkpoint is slow in transformers 5 (Qwen2.5-VL's
150k vocabulary: ``tokenizer.json`` parsed in Python, converted, its BPE rebuilt; several
seconds), and a ``RendererPool`` needs one tokenizer per renderer (a tokenizer is not safe
to share across threads), in every worker process. A snapshot is the tokenizer as
``AutoTokenizer.from_pretrained`` loaded it, pickled once; each ``copy()`` is a separate
instance unpickled from those bytes, a fraction of a load, and encodes exactly as the
loaded one does (pickling keeps the whole object, vocabulary, merges, added tokens and
template). The snapshot itself pickles as its bytes, so a parent process loads once and
sends it to its workers.
"""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any


class TokenizerSnapshot:
    """A loaded tokenizer of checkpoint ``path``, as bytes; ``copy()`` a fresh instance.

    The process that made the snapshot from a tokenizer hands that tokenizer itself out on
    the first ``copy()`` (it was loaded for that use, and pickled before any use), the
    next copies and every copy in another process are unpickled. Make it before the
    tokenizer is used or changed: what is pickled is what the copies are.

    Args:
        tokenizer: The tokenizer, as ``AutoTokenizer.from_pretrained(path)`` returned it.
        path: The checkpoint directory it was loaded from (a snapshot given for another
            checkpoint is refused where it is used: ``belongs_to``).
    """

    __slots__ = ("_data", "_lock", "_original", "path")

    def __init__(self, tokenizer: Any, *, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._data = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
        self._original: Any = tokenizer
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> TokenizerSnapshot:
        """The snapshot of ``AutoTokenizer.from_pretrained(path)``.

        Args:
            path: A checkpoint directory.
        """
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path), path=path)

    @classmethod
    def of_checkpoint(cls, path: str | os.PathLike[str]) -> TokenizerSnapshot | None:
        """``from_pretrained(path)``, or None where ``path`` is not a checkpoint directory
        whose tokenizer loads: whoever needed it then loads from ``path`` itself
        (``load_renderer``), and says why it cannot.

        Args:
            path: A checkpoint directory, or anything else a model may be named by.
        """
        folder = Path(path)
        if (
            not (folder / "config.json").exists()
            and not (folder / "tokenizer_config.json").exists()
        ):
            return None
        try:
            return cls.from_pretrained(folder)
        except Exception:  # whatever it is, the loader meets it again and reports it
            return None

    @property
    def nbytes(self) -> int:
        """The pickled tokenizer's size (what goes to each worker)."""
        return len(self._data)

    def copy(self) -> Any:
        """A tokenizer of its own, equal to the loaded one."""
        with self._lock:
            original, self._original = self._original, None
        return original if original is not None else pickle.loads(self._data)

    def belongs_to(self, path: str | os.PathLike[str]) -> bool:
        """Whether this is the tokenizer of checkpoint ``path`` (the same directory).

        Args:
            path: A checkpoint directory.
        """
        return Path(self.path).resolve() == Path(path).resolve()

    def __getstate__(self) -> tuple[str, bytes]:
        return self.path, self._data

    def __setstate__(self, state: tuple[str, bytes]) -> None:
        self.path, self._data = state
        self._original = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TokenizerSnapshot({self.path!r}, {self.nbytes / 1e6:.1f} MB)"
