"""CoNLL NER data: reading (real WNUT-16 and malformed files), splits, label alignment, predictions back to words."""
import logging

import numpy as np
import pytest
import torch

from bertforge import BertTokenizer
from bertforge.tasks.ner.conll import (IGNORE_INDEX, TaggedSentence, encode_for_tagging, pad_batch, read_conll,
                                  split_tagged_sentences, tag_set, words_from_logits, write_conll)

WNUT_TYPES = ("company", "facility", "geo-loc", "movie", "musicartist", "other", "person", "product",
              "sportsteam", "tvshow")


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return path


@pytest.fixture(scope="module")
def wnut(data_dir):
    return read_conll(data_dir / "wnut16-ner" / "train.conll")


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def label2id(wnut):
    return {tag: i for i, tag in enumerate(tag_set(wnut))}


def one_hot_gold(features, num_labels):
    """Logits that put all weight on the gold label at labelled positions (label 0 elsewhere)."""
    rows = []
    for labels in features.labels:
        logits = np.zeros((len(labels), num_labels), dtype=np.float32)
        logits[np.arange(len(labels)), [max(label, 0) for label in labels]] = 1.0
        rows.append(logits)
    return rows


# ---------------------------------------------------------------- reading

def test_wnut16_counts_match_its_readme(wnut):
    assert len(wnut) == 2394
    assert sum(len(sentence.words) for sentence in wnut) == 46469
    assert wnut[0].words[:3] == ["@paulwalk", "It", "'s"] and wnut[0].line == 1
    assert wnut[0].words[14:17] == ["Empire", "State", "Building"]
    assert wnut[0].tags[14:17] == ["B-facility", "I-facility", "I-facility"]
    assert wnut[1].line == 29  # after a 27-token sentence and its (tab-only) separator line


def test_wnut16_tag_set_is_bio_over_ten_types_with_o_first(wnut):
    tags = tag_set(wnut)
    assert len(tags) == 21
    assert tags[0] == "O"
    assert sorted(tags[1:]) == tags[1:]
    assert set(tags[1:]) == {f"{prefix}-{kind}" for prefix in "BI" for kind in WNUT_TYPES}


def test_reads_tabs_spaces_extra_columns_docstart_crlf_and_bom(tmp_path):
    text = ("\ufeff-DOCSTART- -X- O O\n\n"
            "EU NNP B-NP B-ORG\r\nrejects VBZ B-VP O\n\n\n \t \n"
            "New York\tB-LOC\nis\tO\n"
            "-DOCSTART-\tO\n"
            "Peter\tB-PER")  # no blank line at the end
    sentences = read_conll(write(tmp_path / "a.conll", text))
    assert [(s.words, s.tags, s.line) for s in sentences] == [
        (["EU", "rejects"], ["B-ORG", "O"], 3),
        (["New York", "is"], ["B-LOC", "O"], 8),  # a tab-separated token may hold a space
        (["Peter"], ["B-PER"], 11),  # -DOCSTART- ends a sentence even without a blank line
    ]


def test_one_column_file_is_unlabelled_input(tmp_path):
    sentences = read_conll(write(tmp_path / "a.txt", "Hello\nworld\n\nBye\n"))
    assert [(s.words, s.tags) for s in sentences] == [(["Hello", "world"], None), (["Bye"], None)]
    with pytest.raises(ValueError, match="no sentence has tags"):
        tag_set(sentences)


def test_malformed_lines_are_skipped_and_reported_with_their_line(tmp_path, caplog):
    text = "a\tO\n\tB-PER\nb\t\nc\nd\tB-LOC\n\ne\tO\n"
    problems = []
    with caplog.at_level(logging.WARNING, logger="bertforge.tasks.ner.conll"):
        sentences = read_conll(write(tmp_path / "bad.conll", text), problems=problems)
    assert [(s.words, s.tags) for s in sentences] == [(["a", "d"], ["O", "B-LOC"]), (["e"], ["O"])]
    assert [p.split(": ")[0] for p in problems] == [f"{tmp_path / 'bad.conll'}:{n}" for n in (2, 3, 4)]
    assert "empty token" in problems[0] and "empty tag" in problems[1] and "has no tag" in problems[2]
    assert "skipped 3 malformed line(s)" in caplog.text
    # Without a list the reader still goes on (and still logs).
    assert len(read_conll(tmp_path / "bad.conll")) == 2


def test_extra_columns_in_an_unlabelled_file_are_reported(tmp_path):
    problems = []
    sentences = read_conll(write(tmp_path / "a.txt", "Hello\nworld O\nthere\n"), problems=problems)
    assert sentences[0].words == ["Hello", "there"] and sentences[0].tags is None
    assert len(problems) == 1 and ":2: 2 columns in an unlabelled file" in problems[0]


@pytest.mark.parametrize("text, message", [
    ("", "holds no sentences"),
    ("-DOCSTART- O\n\n \n", "holds no sentences"),
    ("\tO\n\tO\n", r"holds no sentences \(2 malformed line\(s\) skipped, first: .*empty token"),
])
def test_file_without_sentences_is_an_error_naming_the_file(tmp_path, text, message):
    path = write(tmp_path / "empty.conll", text)
    with pytest.raises(ValueError, match=message) as error:
        read_conll(path)
    assert str(path) in str(error.value)


def test_missing_and_non_utf8_files_are_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_conll(tmp_path / "nope.conll")
    path = write(tmp_path / "latin.conll", "a\tO\nMünchen\tB-LOC\n", encoding="latin-1")
    with pytest.raises(ValueError, match=r"latin\.conll is not UTF-8 text \(line 2, byte 0xFC\); convert it"):
        read_conll(path)


def test_sentence_needs_one_tag_per_word():
    with pytest.raises(ValueError, match="2 words but 1 tags"):
        TaggedSentence(["a", "b"], ["O"], line=7)


# ---------------------------------------------------------------- splits and writing

def test_splits_are_disjoint_cover_everything_and_repeat_with_the_seed(wnut):
    train, dev, test = split_tagged_sentences(wnut, seed=0)
    assert (len(train), len(dev), len(test)) == (1915, 240, 239)
    ids = [{id(s) for s in part} for part in (train, dev, test)]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert ids[0] | ids[1] | ids[2] == {id(s) for s in wnut}
    assert [s.line for s in dev] == sorted(s.line for s in dev)  # each part keeps file order
    again = split_tagged_sentences(wnut, seed=0)
    assert [[s.line for s in part] for part in again] == [[s.line for s in part] for part in (train, dev, test)]
    other = split_tagged_sentences(wnut, seed=1)
    assert [s.line for s in other[1]] != [s.line for s in dev]
    generator_split = split_tagged_sentences(wnut, seed=np.random.default_rng(0))
    assert [s.line for s in generator_split[2]] == [s.line for s in test]


@pytest.mark.parametrize("fractions", [(0.8, 0.2), (0.8, 0.3, 0.1), (1.1, -0.1, 0.0), ("a", 0.5, 0.5)])
def test_bad_fractions_are_rejected(wnut, fractions):
    with pytest.raises(ValueError, match="three non-negative numbers"):
        split_tagged_sentences(wnut, fractions=fractions)


def test_written_splits_read_back_the_same(wnut, tmp_path):
    parts = split_tagged_sentences(wnut, seed=3)
    for name, part in zip(("train", "dev", "test"), parts):
        write_conll(part, tmp_path / "splits" / f"{name}.conll")
        back = read_conll(tmp_path / "splits" / f"{name}.conll")
        assert [(s.words, s.tags) for s in back] == [(s.words, s.tags) for s in part]
    unlabelled = [TaggedSentence(["New", "York"]), TaggedSentence(["hi"])]
    write_conll(unlabelled, tmp_path / "input.txt")
    assert [(s.words, s.tags) for s in read_conll(tmp_path / "input.txt")] == [(["New", "York"], None), (["hi"], None)]


@pytest.mark.parametrize("sentences, message", [
    ([TaggedSentence(["a\tb"], ["O"])], "whitespace"),
    ([TaggedSentence(["New York"])], "whitespace"),
    ([TaggedSentence(["a"], [""])], "empty"),
    ([TaggedSentence(["-DOCSTART-"], ["O"])], "document marker"),
    ([TaggedSentence(["a"], ["O"]), TaggedSentence(["b"])], "separate files"),
])
def test_write_refuses_what_the_format_cannot_hold(tmp_path, sentences, message):
    with pytest.raises(ValueError, match=message):
        write_conll(sentences, tmp_path / "out.conll")
    assert not (tmp_path / "out.conll").exists()


# ---------------------------------------------------------------- label alignment

@pytest.mark.parametrize("max_length", [128, 16])
def test_labels_sit_exactly_on_first_pieces(wnut, tokenizer, label2id, max_length):
    features = encode_for_tagging(tokenizer, wnut, label2id, max_length=max_length)
    assert len(features) >= len(wnut)
    assert sorted(set(features.sentence_index)) == list(range(len(wnut)))
    for row, labels in enumerate(features.labels):
        word_ids, sentence = features.word_ids[row], wnut[features.sentence_index[row]]
        assert len(labels) == len(word_ids) == len(features.input_ids[row]) <= max_length
        assert features.input_ids[row][0] == tokenizer.cls_token_id
        assert features.input_ids[row][-1] == tokenizer.sep_token_id
        assert word_ids[0] is None and word_ids[-1] is None and None not in word_ids[1:-1]
        assert features.attention_mask[row] == [1] * len(labels) and features.token_type_ids[row] == [0] * len(labels)
        assert features.first_word[row] == word_ids[1]
        words_in_row = sorted(set(word_ids[1:-1]))
        assert sum(label != IGNORE_INDEX for label in labels) == len(words_in_row)
        for position, word in enumerate(word_ids):
            first_piece = word is not None and word_ids.index(word) == position
            expected = label2id[sentence.tags[word]] if first_piece else IGNORE_INDEX
            assert labels[position] == expected, (row, position)


def test_long_sentences_split_into_consecutive_spans_equal_to_encoding_the_span(wnut, tokenizer, label2id):
    features = encode_for_tagging(tokenizer, wnut, label2id, max_length=16)
    rows_of = {}
    for row, sentence in enumerate(features.sentence_index):
        rows_of.setdefault(sentence, []).append(row)
    split = [s for s, rows in rows_of.items() if len(rows) > 1]
    assert len(split) > 1000  # max_length=16 really forces splitting
    for sentence in split[:200]:
        words = wnut[sentence].words
        covered = [w for row in rows_of[sentence] for w in dict.fromkeys(features.word_ids[row][1:-1])]
        assert covered == list(range(len(words)))  # in order, each word once (WNUT has no pieceless words)
        for row in rows_of[sentence]:
            span = sorted(set(features.word_ids[row][1:-1]))
            alone = tokenizer(words[span[0]:span[-1] + 1], is_split_into_words=True, truncation=True, max_length=16)
            assert features.input_ids[row] == alone["input_ids"]


def test_words_without_pieces_and_overlong_words_still_get_a_prediction(tokenizer):
    # U+200B and BEL are dropped by BERT's text cleaning; the URL is 15 pieces, more than a row holds.
    sentences = [TaggedSentence(["New", "\u200b", "York", "\x07"], ["B-LOC", "O", "I-LOC", "O"]),
                 TaggedSentence(["see", "https://t.co/abcdefXYZ123", "now"], ["O", "B-URL", "O"])]
    label2id = {"O": 0, "B-LOC": 1, "I-LOC": 2, "B-URL": 3}
    features = encode_for_tagging(tokenizer, sentences, label2id, max_length=8)
    assert features.pieceless_words == [(0, 1), (0, 3)]
    assert features.sentence_lengths == [4, 3]
    assert [features.word_ids[row] for row in range(len(features))] == [
        [None, 0, 2, None], [None, 0, None], [None, 1, 1, 1, 1, 1, 1, None], [None, 2, None]]
    assert features.labels[2] == [IGNORE_INDEX, 3] + [IGNORE_INDEX] * 6
    predicted = words_from_logits(features, one_hot_gold(features, 4), ["O", "B-LOC", "I-LOC", "B-URL"])
    assert predicted == [["B-LOC", "O", "I-LOC", "O"], ["O", "B-URL", "O"]]


def test_sentence_of_only_pieceless_words_gets_no_row_but_all_o(tokenizer):
    sentences = [TaggedSentence(["\u200b", "\x07"], ["O", "B-X"]), TaggedSentence(["hi"], ["B-X"])]
    features = encode_for_tagging(tokenizer, sentences, {"O": 0, "B-X": 1})
    assert features.sentence_index == [1] and features.pieceless_words == [(0, 0), (0, 1)]
    assert words_from_logits(features, one_hot_gold(features, 2), ["O", "B-X"]) == [["O", "O"], ["B-X"]]


def test_unlabelled_sentences_encode_without_labels(tokenizer):
    features = encode_for_tagging(tokenizer, [TaggedSentence(["Hello", "world"])], None)
    assert features.labels is None and features.input_ids[0][0] == tokenizer.cls_token_id
    with pytest.raises(ValueError, match="label2id=None"):
        encode_for_tagging(tokenizer, [TaggedSentence(["Hello"])], {"O": 0})


def test_encode_rejects_unknown_tags_and_tiny_max_length(tokenizer):
    sentences = [TaggedSentence(["Paris"], ["B-LOC"], line=12)]
    with pytest.raises(ValueError, match=r"'B-LOC' of the sentence at line 12 is not in label2id"):
        encode_for_tagging(tokenizer, sentences, {"O": 0})
    with pytest.raises(ValueError, match="max_length must be at least 3, got 2"):
        encode_for_tagging(tokenizer, sentences, {"O": 0, "B-LOC": 1}, max_length=2)


def test_pad_batch_pads_ids_mask_and_labels(wnut, tokenizer, label2id):
    features = encode_for_tagging(tokenizer, wnut[:4], label2id)
    batch = pad_batch(features, [2, 0])
    lengths = [len(features.input_ids[i]) for i in (2, 0)]
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert all(t.dtype == torch.long and t.shape == (2, max(lengths)) for t in batch.values())
    short = int(np.argmin(lengths))
    assert batch["input_ids"][short, lengths[short]:].eq(tokenizer.pad_token_id).all()
    assert batch["labels"][short, lengths[short]:].eq(IGNORE_INDEX).all()
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert batch["labels"][0, :lengths[0]].tolist() == features.labels[2]
    unlabelled = encode_for_tagging(tokenizer, [TaggedSentence(["a", "b"])], None)
    assert "labels" not in pad_batch(unlabelled, [0])


# ---------------------------------------------------------------- predictions back to words

@pytest.mark.parametrize("max_length", [128, 16])
def test_gold_one_hot_logits_give_back_the_gold_tags(wnut, tokenizer, label2id, max_length):
    features = encode_for_tagging(tokenizer, wnut, label2id, max_length=max_length)
    id2label = {i: tag for tag, i in label2id.items()}
    predicted = words_from_logits(features, one_hot_gold(features, len(label2id)), id2label)
    assert predicted == [sentence.tags for sentence in wnut]


def test_padded_tensor_logits_and_str_keyed_id2label_work(wnut, tokenizer, label2id):
    features = encode_for_tagging(tokenizer, wnut[:50], label2id, max_length=16)
    batch = pad_batch(features, range(len(features)))
    logits = torch.nn.functional.one_hot(batch["labels"].clamp(min=0), len(label2id)).to(torch.bfloat16)
    id2label = {str(i): tag for tag, i in label2id.items()}  # as read from a config.json
    assert words_from_logits(features, logits, id2label) == [s.tags for s in wnut[:50]]


def test_words_from_logits_checks_rows_lengths_and_labels(wnut, tokenizer, label2id):
    features = encode_for_tagging(tokenizer, wnut[:2], label2id)
    logits = one_hot_gold(features, len(label2id))
    with pytest.raises(ValueError, match="logits for 1 rows but the features have 2"):
        words_from_logits(features, logits[:1], list(label2id))
    with pytest.raises(ValueError, match="row 1: logits of shape"):
        words_from_logits(features, [logits[0], logits[1][:3]], list(label2id))
    with pytest.raises(ValueError, match="not in id2label"):
        words_from_logits(features, logits, ["O"] * 2)
