"""prepare_corpus / TokenizedCorpus: round trip, dtype, vocab check, chunking, held-out views, errors."""
import io
import json
import os
import pickle

import numpy as np
import pytest

from bertforge.tasks.pretraining import TokenizedCorpus, prepare_corpus, read_documents, split_documents, vocab_fingerprint
from bertforge.tasks.pretraining.shards import token_dtype
from bertforge.tokenization.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sources(data_dir, tmp_path_factory):
    """Two slices of real novels (paragraphs as documents) and a JSONL file of reviews."""
    folder = tmp_path_factory.mktemp("sources")
    for name in ("prideprejudice", "persuasion"):
        text = (data_dir / "austen" / f"{name}.txt").read_text(encoding="utf-8")
        (folder / f"{name}.txt").write_text(text[:40_000], encoding="utf-8")
    reviews = [{"review": "I took it for a week. It helped!"}, {"review": "Side effects: none. Works."}]
    (folder / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reviews), encoding="utf-8")
    return [folder / "prideprejudice.txt", folder / "persuasion.txt", folder / "reviews.jsonl"]


@pytest.fixture(scope="module")
def corpus(sources, tokenizer, tmp_path_factory):
    return prepare_corpus(sources, tokenizer, tmp_path_factory.mktemp("prepared") / "c", text_field="review",
                          batch_size=50, progress=False)


def test_round_trip_equals_tokenizing_the_source_sentences(corpus, sources, tokenizer):
    documents = list(read_documents(sources, text_field="review"))
    assert corpus.num_documents == len(documents) > 200
    for index in [0, 1, 7, len(documents) // 2, len(documents) - 2, len(documents) - 1]:
        expected = tokenizer(documents[index], add_special_tokens=False)["input_ids"]
        got = corpus.document(index)
        assert [sentence.tolist() for sentence in got] == expected
        assert all(sentence.dtype == np.int64 for sentence in got)
        assert corpus.sentence_lengths(index).tolist() == [len(ids) for ids in expected]
        assert corpus.tokens(index, 0, min(2, len(expected))).tolist() == sum(expected[:2], [])
        with pytest.raises(IndexError, match="out of range"):
            corpus.tokens(index, 0, len(expected) + 1)
    assert corpus.num_sentences == sum(map(len, documents))
    assert corpus.num_tokens == sum(len(ids) for doc in documents
                                    for ids in tokenizer(doc, add_special_tokens=False)["input_ids"])


def test_meta_records_dtype_counts_vocab_and_sources(corpus, tokenizer, sources):
    meta = json.loads((corpus.folder / "meta.json").read_text())
    assert meta["dtype"] == "uint16"  # a 30,522-token vocab fits in 16 bits
    assert (corpus.folder / "tokens.bin").stat().st_size == 2 * corpus.num_tokens
    assert meta["vocab_sha256"] == vocab_fingerprint(tokenizer.vocab)
    assert meta["vocab_size"] == 30522 and meta["do_lower_case"] is True
    assert meta["sources"] == [str(path) for path in sources]
    assert (meta["num_documents"], meta["num_sentences"], meta["num_tokens"]) == (
        corpus.num_documents, corpus.num_sentences, corpus.num_tokens)
    assert corpus.vocab_tokens[corpus.mask_token_id] == "[MASK]" and len(corpus.vocab_tokens) == 30522
    assert (corpus.cls_token_id, corpus.sep_token_id, corpus.pad_token_id) == (101, 102, 0)


def test_token_dtype_widens_past_16_bits():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.int32


def test_a_tokenizer_with_another_vocab_is_refused(corpus, tokenizer):
    TokenizedCorpus(corpus.folder, tokenizer=tokenizer)  # the same vocab passes
    vocab = tokenizer.vocab
    vocab["the"], vocab["and"] = vocab["and"], vocab["the"]  # same tokens, two ids swapped
    other = BertTokenizer.from_vocab(vocab)
    with pytest.raises(ValueError, match="different vocabulary .* prepare it again"):
        TokenizedCorpus(corpus.folder, tokenizer=other)
    with pytest.raises(ValueError, match="do_lower_case=True"):
        corpus.check_tokenizer(BertTokenizer.from_vocab(tokenizer.vocab, do_lower_case=False))


def test_batches_of_documents_give_the_same_files_as_one_batch(corpus, sources, tokenizer, tmp_path):
    whole = prepare_corpus(sources, tokenizer, tmp_path / "whole", text_field="review", batch_size=100_000,
                           progress=False)
    ones = prepare_corpus(sources, tokenizer, tmp_path / "ones", text_field="review", batch_size=1, progress=False)
    for name in ("tokens.bin", "sentence_offsets.bin", "document_offsets.bin", "vocab.txt"):
        reference = (corpus.folder / name).read_bytes()
        assert (whole.folder / name).read_bytes() == reference == (ones.folder / name).read_bytes(), name


def test_empty_sentences_and_documents_are_dropped(tokenizer, tmp_path):
    source = tmp_path / "a.jsonl"
    # "\u200b" (zero-width space) is a sentence with no tokens; the second document has only that.
    source.write_text('{"text": "Hello there.\\n\\n\\u200b\\n\\nBye."}\n{"text": "\\u200b"}\n{"text": "Last."}\n')
    corpus = prepare_corpus(source, tokenizer, tmp_path / "out", split_sentences=lambda text: [text.strip()],
                            progress=False)
    assert corpus.num_documents == 2
    assert [len(corpus.document(i)) for i in range(2)] == [2, 1]


def test_subset_views_and_held_out_split(corpus):
    train, heldout = split_documents(corpus, 0.1, np.random.default_rng(0))
    assert heldout.num_documents == round(0.1 * corpus.num_documents)
    train_ids = [train.source_index(i) for i in range(train.num_documents)]
    heldout_ids = [heldout.source_index(i) for i in range(heldout.num_documents)]
    assert sorted(train_ids + heldout_ids) == list(range(corpus.num_documents))
    assert train.num_tokens + heldout.num_tokens == corpus.num_tokens
    assert train.num_sentences + heldout.num_sentences == corpus.num_sentences
    index = heldout_ids[3]
    assert [s.tolist() for s in heldout.document(3)] == [s.tolist() for s in corpus.document(index)]
    nested = heldout.subset([3, 0])
    assert nested.source_index(0) == index and nested.num_documents == 2
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        split_documents(corpus, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"must lie in \[0, "):
        corpus.subset([corpus.num_documents])


def test_pickles_as_a_folder_reference_not_a_copy(corpus):
    data = pickle.dumps(corpus.subset([1, 2]))
    assert len(data) < 10_000
    restored = pickle.loads(data)
    assert [s.tolist() for s in restored.document(1)] == [s.tolist() for s in corpus.document(2)]


# ---------------------------------------------------------------- errors

def test_empty_corpus(tokenizer, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="no text found"):
        prepare_corpus(tmp_path / "empty.txt", tokenizer, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "tokens.bin").exists()


def test_missing_file_fails_before_any_output(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="missing.txt does not exist"):
        prepare_corpus([tmp_path / "missing.txt"], tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_output_dir_is_not_overwritten_unless_asked(corpus, sources, tokenizer, tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match="holds other files, not a prepared corpus"):
            prepare_corpus(sources[2], tokenizer, tmp_path, text_field="review", overwrite=overwrite, progress=False)
    first = prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", progress=False)
    with pytest.raises(ValueError, match="it holds a prepared corpus; pass --overwrite"):
        prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", progress=False)
    (tmp_path / "c" / "mine.txt").write_text("precious")
    again = prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", overwrite=True,
                           progress=False)
    assert again.num_tokens == first.num_tokens
    assert (tmp_path / "c" / "mine.txt").read_text() == "precious"  # only the corpus's own files are replaced


def test_an_interrupted_corpus_is_named_as_such(sources, tokenizer, tmp_path):
    """What a prepare killed before meta.json (an older bertforge, or a kill while publishing) leaves."""
    prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", progress=False)
    (tmp_path / "c" / "meta.json").unlink()
    with pytest.raises(ValueError, match=r"an incomplete corpus \(its preparation was stopped\); pass --overwrite"):
        prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", progress=False)
    with pytest.raises(ValueError, match="prepare was interrupted"):
        TokenizedCorpus(tmp_path / "c")
    assert prepare_corpus(sources[2], tokenizer, tmp_path / "c", text_field="review", overwrite=True,
                          progress=False).num_documents > 0


def test_a_bad_record_halfway_leaves_no_partial_corpus(tokenizer, tmp_path):
    source = tmp_path / "a.jsonl"
    source.write_text('{"text": "Fine."}\n' * 5 + '{"txt": "typo"}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl:6: a record needs a str 'text'"):
        prepare_corpus(source, tokenizer, tmp_path / "out", batch_size=2, progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_not_a_prepared_folder(tmp_path):
    with pytest.raises(ValueError, match="not a prepared corpus .* make one with prepare_corpus"):
        TokenizedCorpus(tmp_path)


def test_batch_size_must_be_positive(sources, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        prepare_corpus(sources, tokenizer, tmp_path / "out", batch_size=0)


def test_writing_a_batch_leaves_no_place_for_a_ctrl_c_to_become_a_type_error(sources, tokenizer, tmp_path,
                                                                             monkeypatch):
    """numpy's tofile, given a file object, first asks whether it is os.PathLike, and an interrupt landing in that
    check came out as a TypeError (`bertforge prepare` stopped with Ctrl-C: a traceback and exit 1, not 130). The
    batches are written without that check: here an interrupt waits in it, and the corpus is written whole."""
    def interrupted(cls, subclass):
        if issubclass(subclass, io.BufferedWriter):
            raise KeyboardInterrupt
        return NotImplemented

    monkeypatch.setattr(os.PathLike, "__subclasshook__", classmethod(interrupted))
    os.PathLike._abc_caches_clear()
    try:
        corpus = prepare_corpus(sources[:1], tokenizer, tmp_path / "c", batch_size=50, progress=False)
    finally:
        monkeypatch.undo()
        os.PathLike._abc_caches_clear()
    documents = list(read_documents(sources[:1]))
    assert corpus.num_documents == len(documents) > 50
