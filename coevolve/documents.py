"""Document pools (PasoDoble's knowledge base 𝒦, INFUSER's 𝒟_doc) and INFUSER's dev set 𝒟_dev.

Sources of passages (``load_documents``):

- ``arith``: fact sheets of the arithmetic world (``a=3,b=7,c=2``, :func:`coevolve.tasks.arith.random_doc`), a fixed
  seeded pool over the training levels;
- ``openstax``: the OpenStax algebra books (CNXML, ``corpus_openstax_algebra/modules/*/index.cnxml``), read with
  ``xml.etree.ElementTree``: each module's title and the text of its paragraphs, lists, notes and worked examples
  (MathML flattened to its symbols); exercises (answer keys) and figure/table captions are left out, as INFUSER's
  chunk judge discards answer keys and navigational text (INFUSER §3.1);
- ``proofwiki``: ProofWiki theorem statements (``corpus_proofwiki/*.json``, one JSON object keyed by id), read with
  ``json``;
- a path: a ``.txt`` file (paragraphs split at blank lines), a ``.jsonl`` file (its ``text`` field), a ``.json`` file
  in the ProofWiki layout, a ``.cnxml`` file, or a folder of any of these;
- a data set the ``datasets`` library reads (the format of large corpora such as Nemotron-CC-Math): a ``.parquet``
  file, a folder of ``.parquet`` files (a downloaded Hugging Face dataset repository), a folder written by
  ``Dataset.save_to_disk``, or ``hf:<hub id>`` (needs a connection); its ``text`` column, or the one named after a
  ``#`` (``corpus.parquet#question``). Rows are streamed (parquet) or memory-mapped (``save_to_disk``), and with a
  pool size (``limit``) the pool is a seeded reservoir sample of the chunks, so a corpus larger than memory works.

Long texts are split into chunks of ``min_tokens``..``max_tokens`` tokens (INFUSER §3.1: paragraph split,
then sentence split, then comma/semicolon split, then a plain cut; fragments under ``min_tokens`` are dropped);
PasoDoble keeps passages of at most 1,024 tokens (PasoDoble §3.2), which the same bounds express.

Sampling: PasoDoble draws uniformly with replacement (:meth:`DocumentPool.sample`); INFUSER walks seeded shuffles
without replacement, reshuffling at each epoch (:meth:`DocumentPool.take`). Both are pure functions of (seed,
position), so a resumed run draws what it would have.

Dev sets (:func:`dev_set`): a seeded subset of an evaluation-quality set that the recipe never trains on and never
shows the generator: ``arith`` the grounded level-4 held-out slice (disjoint from the plain ``arith_l*`` evaluation
sets and excluded from every training sampler), ``math`` MATH test problems outside MATH-500 (or a GSM8K test subset),
``mcq`` the SuperGPQA sample.
"""

from __future__ import annotations

import json
import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from coevolve.data.benchmarks import default_data_dirs, load_benchmark
from coevolve.tasks import arith
from coevolve.tasks.registry import Problem

TokenCounter = Callable[[str], int]

CNXML_NS = "{http://cnx.rice.edu/cnxml}"
MATHML_NS = "{http://www.w3.org/1998/Math/MathML}"
_CNXML_SKIP = {"exercise", "figure", "table", "metadata", "media", "caption"}
_CNXML_TEXT = {"para", "title", "item", "equation"}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CLAUSE = re.compile(r"(?<=[,;])\s+")
_SOURCES = ("arith", "openstax", "proofwiki")


def word_count(text: str) -> int:
    """A tokenizer-free token count (whitespace words); pass a tokenizer's count for exact bounds."""
    return len(text.split())


def tokenizer_counter(tokenizer) -> TokenCounter:
    """Token count under ``tokenizer`` (no special tokens): the bounds of PasoDoble §3.2 (its tokenizer unnamed)
    and INFUSER §3.1."""
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------- readers


def _mathml_text(node: ET.Element) -> str:
    return " ".join(t.strip() for t in node.itertext() if t.strip())


def _local(node: ET.Element) -> str:
    return node.tag.replace(CNXML_NS, "")


def _inline_text(node: ET.Element, nested: list[ET.Element]) -> str:
    """The text of a paragraph-like element: inline markup kept as text, MathML flattened, lists deferred."""
    parts = [node.text or ""]
    for child in node:
        if child.tag.startswith(MATHML_NS):
            parts.append(" " + _mathml_text(child) + " ")
        elif _local(child) == "list":
            nested.append(child)
        elif _local(child) not in _CNXML_SKIP:
            parts.append(_inline_text(child, nested))
        parts.append(child.tail or "")
    return "".join(parts)


def _cnxml_blocks(node: ET.Element, out: list[str]) -> None:
    """Append the text blocks under ``node`` (one per paragraph-like element), skipping exercises and figures."""
    tag = _local(node)
    if tag in _CNXML_SKIP:
        return
    if tag in _CNXML_TEXT:
        nested: list[ET.Element] = []
        text = " ".join(_inline_text(node, nested).split())
        if text:
            out.append(text)
        for child in nested:
            _cnxml_blocks(child, out)
        return
    for child in node:
        _cnxml_blocks(child, out)


class DocumentError(ValueError):
    """A document source that cannot be read as text; the message is one line naming the file and why."""


def read_cnxml(path: str | Path) -> str:
    """One OpenStax module as plain text: its title, then its blocks separated by blank lines."""
    root = ET.parse(path).getroot()
    title = root.find(f"{CNXML_NS}title")
    blocks: list[str] = [" ".join(title.itertext()).strip()] if title is not None else []
    content = root.find(f"{CNXML_NS}content")
    if content is not None:
        _cnxml_blocks(content, blocks)
    return "\n\n".join(b for b in blocks if b)


def read_proofwiki(path: str | Path) -> list[str]:
    """The ``text`` of every entry of a ProofWiki JSON file (``{id: {"text": ..., ...}}``)."""
    data = json.loads(Path(path).read_text())
    return [str(entry["text"]).strip() for entry in data.values() if str(entry.get("text", "")).strip()]


def read_jsonl(path: str | Path, field: str = "text") -> list[str]:
    """The ``field`` of every JSON line that has it."""
    texts = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            value = json.loads(line).get(field)
            if isinstance(value, str) and value.strip():
                texts.append(value.strip())
    return texts


def read_text(path: str | Path) -> str:
    return Path(path).read_text()


# ----------------------------------------------------------------------------- chunking


def _split(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [p for p in pattern.split(text) if p.strip()]


def _hard_cut(text: str, max_tokens: int, count: TokenCounter) -> list[str]:
    """Cut at word boundaries so each piece has at most ``max_tokens`` tokens (a single over-long word stays whole)."""
    pieces, current = [], ""
    for word in text.split():
        candidate = f"{current} {word}".strip()
        if current and count(candidate) > max_tokens:
            pieces.append(current)
            candidate = word
        current = candidate
    return pieces + ([current] if current else [])


def _fit(text: str, max_tokens: int, count: TokenCounter, level: int = 0) -> list[str]:
    """Pieces of ``text`` of at most ``max_tokens``: split by sentences, then clauses, then words."""
    if count(text) <= max_tokens:
        return [text]
    splitters = (_SENTENCE, _CLAUSE)
    if level >= len(splitters):
        return _hard_cut(text, max_tokens, count)
    parts = _split(text, splitters[level])
    if len(parts) <= 1:
        return _fit(text, max_tokens, count, level + 1)
    return _pack([p for part in parts for p in _fit(part, max_tokens, count, level + 1)], max_tokens, count, " ")


def _pack(pieces: Sequence[str], max_tokens: int, count: TokenCounter, sep: str) -> list[str]:
    """Greedily join consecutive pieces while their summed token counts stay within ``max_tokens``.

    Each piece is counted once (a joined chunk's count is taken as the sum of its pieces'), so packing is linear.
    """
    chunks, current, used = [], "", 0
    for piece in pieces:
        size = count(piece)
        if current and used + size > max_tokens:
            chunks.append(current)
            current, used = "", 0
        current, used = (f"{current}{sep}{piece}" if current else piece), used + size
    return chunks + ([current] if current else [])


def chunk_text(text: str, min_tokens: int, max_tokens: int, count: TokenCounter = word_count) -> list[str]:
    """Split ``text`` into chunks of ``min_tokens``..``max_tokens`` tokens (INFUSER §3.1).

    Paragraphs (blank-line separated) are packed greedily; a paragraph over ``max_tokens`` falls back to sentences,
    then comma/semicolon clauses, then word cuts. Chunks under ``min_tokens`` are dropped.
    """
    if not 0 < min_tokens <= max_tokens:
        raise ValueError(f"need 0 < min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    pieces = [piece for p in paragraphs for piece in _fit(p, max_tokens, count)]
    return [c for c in _pack(pieces, max_tokens, count, "\n\n") if count(c) >= min_tokens]


# ----------------------------------------------------------------------------- pools


@dataclass
class DocumentPool:
    """A fixed list of passages with seeded, position-addressed sampling."""

    passages: list[str]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.passages:
            raise ValueError(f"document pool {self.name!r} is empty")

    def __len__(self) -> int:
        return len(self.passages)

    def sample(self, seed: int, n: int) -> list[str]:
        """``n`` passages drawn uniformly with replacement (PasoDoble §3.2)."""
        rng = random.Random(seed)
        return [self.passages[rng.randrange(len(self.passages))] for _ in range(n)]

    def take(self, seed: int, start: int, n: int) -> list[str]:
        """Passages ``start .. start+n-1`` of an endless walk over seeded shuffles, one per epoch (INFUSER §3.1)."""
        out = []
        for k in range(start, start + n):
            epoch, offset = divmod(k, len(self.passages))
            order = list(range(len(self.passages)))
            random.Random(f"{seed}/epoch/{epoch}").shuffle(order)
            out.append(self.passages[order[offset]])
        return out


def arith_fact_sheets(n: int, levels: Sequence[int] = (1, 2, 3), seed: int = 0) -> list[str]:
    """``n`` distinct fact sheets of the arithmetic world (each of a level drawn from ``levels``)."""
    rng = random.Random(f"fact-sheets/{seed}")
    sheets: dict[str, None] = {}
    while len(sheets) < n:
        sheets.setdefault(arith.random_doc(rng.choice(list(levels)), rng))
    return list(sheets)


def _data_root(data_dir: str | None) -> Path:
    candidates = ([Path(data_dir)] if data_dir else []) + default_data_dirs()
    for folder in candidates:
        if (folder / "corpus_openstax_algebra").is_dir() or (folder / "corpus_proofwiki").is_dir():
            return folder
    raise FileNotFoundError(f"no corpus folder found under {', '.join(map(str, candidates))}: pass data_dir")


def _file_texts(path: Path) -> list[str]:
    """Raw texts (before chunking) of one file, by its extension; :class:`DocumentError` if it cannot be read."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".cnxml":
            return [read_cnxml(path)]
        if suffix == ".jsonl":
            return read_jsonl(path)
        if suffix == ".json":
            return read_proofwiki(path)
        return [read_text(path)]
    except RecursionError:
        raise DocumentError(f"document {path}: its elements are nested too deeply to read") from None
    except (OSError, ValueError, ET.ParseError, KeyError, TypeError, AttributeError) as exc:
        why = " ".join(str(exc).split())[:200]
        raise DocumentError(f"document {path} cannot be read as a {suffix or 'text'} file "
                            f"({type(exc).__name__}: {why})") from None


def _path_texts(path: Path) -> list[str]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".cnxml", ".jsonl", ".json", ".txt"))
        return [t for f in files for t in _file_texts(f)]
    return _file_texts(path)


def dataset_source(source: str) -> tuple[str, str] | None:
    """(location, text column) of a source the ``datasets`` library reads (a ``.parquet`` file, a folder of them, a
    ``save_to_disk`` folder, ``hf:<hub id>``; ``#column`` picks the column, default ``text``); None for another
    source."""
    location, _, column = source.partition("#")
    path = Path(location)
    if location.startswith("hf:") or (path.is_file() and path.suffix.lower() == ".parquet") or (
            path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
                               or any(path.rglob("*.parquet")))):
        return location, column or "text"
    return None


def dataset_texts(location: str, column: str) -> Iterator[str]:
    """The non-empty strings of ``column``, row by row, of a data set (:func:`dataset_source`); DocumentError when
    it cannot be read or has no such column."""
    import datasets

    path = Path(location)
    try:
        if location.startswith("hf:"):
            rows = datasets.load_dataset(location[3:], split="train", streaming=True)
        elif path.is_dir() and not any(path.rglob("*.parquet")):  # save_to_disk: memory-mapped Arrow files
            rows = datasets.load_from_disk(str(path))
            if isinstance(rows, datasets.DatasetDict):
                rows = rows["train"] if "train" in rows else rows[sorted(rows)[0]]
        else:
            files = [str(path)] if path.is_file() else sorted(str(f) for f in path.rglob("*.parquet"))
            rows = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        if rows.column_names is not None and column not in rows.column_names:
            raise DocumentError(f"document source {location!r} has no column {column!r} (its columns: "
                                f"{', '.join(rows.column_names)}); name one after a '#'")
        for row in rows:
            value = row.get(column)
            if isinstance(value, str) and value.strip():
                yield value
    except DocumentError:
        raise
    except Exception as exc:  # datasets / pyarrow / hub errors: one line naming the source
        why = " ".join(str(exc).split())[:200]
        raise DocumentError(f"document source {location!r} cannot be read as a data set "
                            f"({type(exc).__name__}: {why})") from None


def reservoir(items: Iterable[str], n: int, rng: random.Random) -> list[str]:
    """A uniform sample of ``n`` of ``items`` (all of them when fewer) in their original order, holding at most
    ``n`` in memory (Algorithm R)."""
    kept: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if i < n:
            kept.append((i, item))
        elif (j := rng.randrange(i + 1)) < n:
            kept[j] = (i, item)
    return [item for _, item in sorted(kept)]


def load_documents(source: str, *, min_tokens: int = 1, max_tokens: int = 1024, count: TokenCounter = word_count,
                   data_dir: str | None = None, limit: int | None = None, seed: int = 0,
                   arith_levels: Sequence[int] = (1, 2, 3)) -> DocumentPool:
    """A document pool from ``source`` (``arith``, ``openstax``, ``proofwiki`` or a path), chunked to the bounds.

    ``limit`` keeps a seeded subset of that many chunks (``arith``: the pool size, default 1,000 sheets).
    """
    if source == "arith":
        return DocumentPool(arith_fact_sheets(limit or 1000, arith_levels, seed), "arith")
    if (dataset := dataset_source(source)) is not None:
        streamed = (c for text in dataset_texts(*dataset) for c in chunk_text(text, min_tokens, max_tokens, count))
        chunks = reservoir(streamed, limit, random.Random(f"pool/{seed}")) if limit is not None else list(streamed)
        if not chunks:
            raise DocumentError(f"document source {source!r} holds no text")
        return DocumentPool(chunks, source)
    chunks = [c for text in document_texts(source, data_dir) for c in chunk_text(text, min_tokens, max_tokens, count)]
    if limit is not None and limit < len(chunks):
        keep = sorted(random.Random(f"pool/{seed}").sample(range(len(chunks)), limit))
        chunks = [chunks[i] for i in keep]
    return DocumentPool(chunks, source)


def document_texts(source: str, data_dir: str | None = None) -> list[str]:
    """The raw texts (before chunking) of a document source other than ``arith``: FileNotFoundError when it does
    not exist, :class:`DocumentError` when a file of it cannot be read or it holds no text."""
    if source == "openstax":
        texts = _path_texts(_data_root(data_dir) / "corpus_openstax_algebra" / "modules")
    elif source == "proofwiki":
        texts = _path_texts(_data_root(data_dir) / "corpus_proofwiki" / "train.json")
    elif Path(source).exists():
        texts = _path_texts(Path(source))
    else:
        raise FileNotFoundError(f"document source {source!r} is neither one of {_SOURCES} nor an existing path")
    if not any(text.strip() for text in texts):
        raise DocumentError(f"document source {source!r} holds no text")
    return texts


def check_document_source(source: str, key: str, data_dir: str | None = None) -> None:
    """Read a document source before the model loads; a missing or unreadable one is a ConfigError naming ``key``."""
    from coevolve.config import ConfigError

    if source == "arith":
        return
    try:
        if (dataset := dataset_source(source)) is not None:  # the first text only: the corpus may be large
            if next(dataset_texts(*dataset), None) is None:
                raise DocumentError(f"document source {source!r} holds no text")
            return
        document_texts(source, data_dir)
    except (FileNotFoundError, DocumentError) as exc:
        raise ConfigError(f"config key '{key}': {exc}") from None


# ----------------------------------------------------------------------------- dev sets


def dev_set(task: str, n: int, *, source: str | None = None, seed: int = 0, data_dir: str | None = None,
            levels: Sequence[int] = (4,)) -> list[Problem]:
    """INFUSER's 𝒟_dev: ``n`` verified (question, answer) pairs from the target distribution (INFUSER §2.3).

    ``arith``: the grounded held-out slices of ``levels``, taken in turn (level by level: the first question of each,
    then the second, ...), so the levels share ``n`` evenly; evaluation reads the plain held-out sets and training
    samplers exclude both. ``math``: ``source`` ``math`` (default; MATH test outside MATH-500, which is evaluated) or
    ``gsm8k`` (GSM8K test: then leave gsm8k out of the evaluation sets). ``mcq``: the SuperGPQA sample, with the
    choices rendered into the question and the gold letter as answer.
    """
    from coevolve.tasks import mcq

    if task == "arith":
        per_level = -(-n // len(levels))
        slices = [arith.held_out(level, per_level, grounded=True) for level in levels]
        mixed = [s[i] for i in range(per_level) for s in slices][:n]
        return [Problem(p.question, str(p.answer), p.doc, p.level) for p in mixed]
    if task == "math":
        name = source or "math"
        items = load_benchmark(name, data_dir=data_dir)
        if name == "math":
            evaluated = {i.question.strip() for i in load_benchmark("math500", data_dir=data_dir)}
            items = [i for i in items if i.question.strip() not in evaluated]
        chosen = random.Random(f"dev/{seed}").sample(items, min(n, len(items)))
        return [Problem(i.question, i.answer) for i in chosen]
    if task == "mcq":
        items = load_benchmark(source or "supergpqa", data_dir=data_dir)
        chosen = random.Random(f"dev/{seed}").sample(items, min(n, len(items)))
        return [Problem(mcq.render_question(i.question, i.choices or ()), i.answer) for i in chosen]
    raise ValueError(f"no dev set for task {task!r} (known: arith, math, mcq)")

