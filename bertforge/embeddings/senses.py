"""Word senses: the in-context vectors of every occurrence of a word, clustered and drawn.

Each occurrence's vector is the mean of its word pieces' hidden states, the occurrences and their
pieces found as `Embedder.word_vector` finds them (words.py), but batched over many sentences.
k-means on the L2-normalised vectors splits them into senses; the number of senses is the k
in 2..max_senses with the highest silhouette (cosine). PCA (and UMAP when `umap-learn` is
installed) puts them in 2-D for a scatter plot, one colour per sense.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.metrics import silhouette_score
from tqdm.auto import tqdm

from ..atomic import replaced_file
from ..errors import UsageError
from ..validation import checked
from .similarity import l2_normalized
from .words import Occurrence, find_occurrences, word_pattern, word_pieces

MIN_OCCURRENCES = 4  # k-means into 2 senses and a silhouette need a few points in each


@dataclass
class Senses:
    word: str
    occurrences: list[Occurrence]
    vectors: np.ndarray          # (n, dim), L2-normalised
    labels: np.ndarray           # (n,) sense of each occurrence, 0..k-1, sense 0 the largest
    silhouettes: dict[int, float]
    skipped: int = 0             # occurrences past the model's max_length, left out
    points: dict[str, np.ndarray] = field(default_factory=dict)  # projection name -> (n, 2)

    @property
    def num_senses(self) -> int:
        return int(self.labels.max()) + 1

    def examples(self, sense: int, count: int = 3) -> list[Occurrence]:
        """The occurrences of a sense nearest its centre (cosine): its most typical contexts."""
        members = np.flatnonzero(self.labels == sense)
        centre = self.vectors[members].mean(axis=0)
        order = np.argsort(-(self.vectors[members] @ centre), kind="stable")
        return [self.occurrences[members[i]] for i in order[:count]]


def occurrence_vectors(embedder, occurrences: list[Occurrence]) -> tuple[np.ndarray, list[int]]:
    """(vectors (kept, dim) float32, kept indices): each occurrence's word vector, batched.

    Each sentence is read after the Embedder's prompt, as `Embedder.word_vector` reads it. An occurrence that
    the model's max_length cuts off (even partly) is left out, as `Embedder.word_vector` refuses it; `kept` says
    which ones have a vector.
    """
    order = sorted(range(len(occurrences)), key=lambda i: len(occurrences[i].sentence))  # less padding
    vectors = {}
    show = len(occurrences) > 8 * embedder.batch_size
    for first in tqdm(range(0, len(order), embedder.batch_size), desc="word vectors", disable=not show):
        batch = [occurrences[i] for i in order[first:first + embedder.batch_size]]
        # read after the folder's prompt, as `Embedder.word_vector` reads a word (without it, the same occurrence
        # had another vector here: cosine 0.983 under a "query: " prompt)
        texts = embedder.prompted([occurrence.sentence for occurrence in batch])
        encoded = embedder.tokenize(texts, offsets=True)
        states = embedder.layer_states(embedder.forward(encoded))  # (batch, seq, dim)
        for row, occurrence in enumerate(batch):
            shift = len(texts[row]) - len(occurrence.sentence)  # the prompt's characters before the sentence
            pieces = word_pieces(encoded["offset_mapping"][row].tolist(), occurrence.start + shift,
                                 occurrence.end + shift)
            if pieces is not None:
                vectors[order[first + row]] = states[row, pieces].mean(dim=0).cpu().numpy()
    kept = sorted(vectors)
    return (np.stack([vectors[i] for i in kept]) if kept else np.zeros((0, embedder.dim), np.float32)), kept


def cluster_senses(vectors: np.ndarray, max_senses: int = 6, seed: int = 0) -> tuple[np.ndarray, dict[int, float]]:
    """(labels, {k: silhouette}) for k = 2..max_senses; the labels of the best k, sense 0 the largest."""
    if len(vectors) < MIN_OCCURRENCES:
        raise ValueError(f"{len(vectors)} occurrence(s) are too few to tell senses apart; "
                         f"give a corpus with at least {MIN_OCCURRENCES}")
    checked("max_senses", max_senses)
    silhouettes, labelings = {}, {}
    for k in range(2, min(max_senses, len(vectors) - 1) + 1):
        labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(vectors)
        silhouettes[k] = float(silhouette_score(vectors, labels, metric="cosine"))
        labelings[k] = labels
    best = max(silhouettes, key=silhouettes.get)
    sizes = np.bincount(labelings[best], minlength=best)
    renumber = np.empty(best, dtype=np.int64)
    renumber[np.argsort(-sizes, kind="stable")] = np.arange(best)
    return renumber[labelings[best]], silhouettes


def project(vectors: np.ndarray, seed: int = 0, umap: bool | None = None) -> dict[str, np.ndarray]:
    """2-D views of the vectors: PCA always; UMAP too when asked, or (umap=None) when umap-learn is installed.

    UMAP's first call in a process compiles its numba code (tens of seconds on a small CPU).
    Raises ValueError when umap=True and umap-learn is not installed.
    """
    points = {"PCA": PCA(n_components=2, random_state=seed).fit_transform(vectors)}
    if umap is False:
        return points
    try:
        import umap as umap_learn  # optional: pip install umap-learn
    except ImportError:
        if umap:
            raise ValueError("a UMAP panel needs umap-learn: pip install umap-learn (or leave UMAP out)") from None
        return points
    neighbours = min(15, len(vectors) - 1)
    points["UMAP"] = umap_learn.UMAP(n_neighbors=neighbours, metric="cosine", random_state=seed,
                                     n_jobs=1).fit_transform(vectors)
    return points


def word_senses(embedder, sentences: Iterable[str], word: str, max_senses: int = 6, max_occurrences: int = 2000,
                seed: int = 0, umap: bool | None = False, source: str = "the corpus") -> Senses:
    """Find, embed, cluster and project every occurrence of word in sentences (at most max_occurrences,
    a seeded sample beyond that); umap as in `project`. Raises ValueError for a bad word or too few
    occurrences (naming `source`, where the sentences came from)."""
    pattern_check = word_pattern(word)  # a bad word fails before the corpus is read
    if max_occurrences < MIN_OCCURRENCES:  # a sample that small always failed, naming its size as the word's count
        raise UsageError(f"--max-occurrences {max_occurrences}: senses need at least {MIN_OCCURRENCES} occurrences; "
                         f"give {MIN_OCCURRENCES} or more")
    occurrences = find_occurrences(sentences, word)
    if len(occurrences) > max_occurrences:
        chosen = np.sort(np.random.default_rng(seed).choice(len(occurrences), max_occurrences, replace=False))
        occurrences = [occurrences[i] for i in chosen]
    if len(occurrences) < MIN_OCCURRENCES:
        raise ValueError(f"{word!r} occurs {len(occurrences)} time(s) in {source} (as a whole word, pattern "
                         f"{pattern_check.pattern}); senses need at least {MIN_OCCURRENCES}: give a larger corpus")
    vectors, kept = occurrence_vectors(embedder, occurrences)
    vectors = l2_normalized(vectors)
    labels, silhouettes = cluster_senses(vectors, max_senses, seed)
    senses = Senses(word, [occurrences[i] for i in kept], vectors, labels, silhouettes,
                    skipped=len(occurrences) - len(kept))
    senses.points = project(vectors, seed, umap)
    return senses


def check_plot_path(path: str | Path) -> Path:
    """`path` as a Path when a plot can be written there; UsageError (before any work) when it is a folder
    or its suffix is not an image format matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"the plot path {path} is a folder; give a file name ending in .png, .svg or .pdf")
    image_format = path.suffix.lstrip(".").lower() or "png"
    if image_format not in FigureCanvasBase.get_supported_filetypes():
        raise UsageError(f"the plot path {path} ends in {path.suffix!r}, not an image format; "
                         "end it in .png, .svg or .pdf")
    return path


def plot_senses(senses: Senses, path: str | Path, examples: int = 1) -> Path:
    """A scatter plot per projection, coloured by sense, with each sense's most typical contexts below."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no display needed

    path = check_plot_path(path)

    k, panels = senses.num_senses, list(senses.points.items())
    lines = [f"sense {sense + 1}: {occurrence.context(50)}" for sense in range(k)
             for occurrence in senses.examples(sense, examples)]
    text_height = 0.2 * len(lines) + 0.3
    # Wide enough for the contexts (8-point monospace, ~0.067 in a character): one PCA panel (no umap-learn) in a
    # 6.5-inch figure was squeezed to a third of it by the layout making room for the longer lines.
    text_width = 0.067 * max(map(len, lines), default=0) + 0.5
    figure = Figure(figsize=(max(6.5 * len(panels), text_width), 6 + text_height), layout="constrained")
    grid = figure.add_gridspec(2, len(panels), height_ratios=(6, text_height))
    for column, (name, points) in enumerate(panels):
        axis = figure.add_subplot(grid[0, column])
        for sense in range(k):
            members = senses.labels == sense
            axis.scatter(points[members, 0], points[members, 1], s=12, alpha=0.7, color=f"C{sense % 10}",
                         label=f"sense {sense + 1} ({int(members.sum())})")
        axis.set_title(name)
        axis.set_xticks([])
        axis.set_yticks([])
        axis.legend(loc="best", fontsize=8)
    notes = figure.add_subplot(grid[1, :])
    notes.axis("off")
    notes.text(0, 1, "\n".join(lines), fontsize=8, va="top", ha="left", family="monospace").set_in_layout(False)
    figure.suptitle(f"\"{senses.word}\": {len(senses.occurrences)} occurrences, {k} senses "
                    f"(silhouette {senses.silhouettes[k]:.3f})")
    with replaced_file(path) as temporary:
        figure.savefig(temporary, format=path.suffix.lstrip(".").lower() or "png", dpi=110)
    return path
