"""Labelled tables: reading CSV/TSV/JSONL rows, the label space, and windows of token ids."""
import json
import logging

import pytest
import torch

from bertforge import BertTokenizer
from bertforge.models.config import BertConfig
from bertforge.tasks.classification.labels import LabelSpace
from bertforge.tasks.classification.reader import read_rows
from bertforge.tasks.classification.windows import encode_windows, pad_batch

NUMBERS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
          "sixteen seventeen eighteen nineteen twenty twentyone"  # one word piece each but the last


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


# ---------------------------------------------------------------- reading rows

def test_reads_the_real_tweets_csv(data_dir):
    rows = read_rows(data_dir / "tweets-sentiment" / "tweets.csv", text_columns=["text"], label_column="sentiment")
    assert len(rows) == 38158 and rows.skipped == []
    assert rows.texts[0] == ("I just don't trust my life in google's hands #driverless cars_—_.no thank you",)
    assert rows.labels[0] == "negative" and rows.row_numbers[:2] == [2, 3]
    space = LabelSpace.infer(rows.labels)
    assert space.labels == ["negative", "neutral", "positive"]
    assert space.problem_type == "single_label_classification"


def test_reads_text_pairs_from_the_real_drug_reviews_tsv(data_dir):
    rows = read_rows(data_dir / "drug-reviews" / "train.tsv", text_columns=["drugName", "review"],
                     label_column="rating")
    assert len(rows) == 600
    assert rows.texts[0][0] == "Nubain" and rows.texts[0][1].startswith('"I recently received an injection')
    assert sorted(set(rows.labels)) == ["negative", "neutral", "positive"]


@pytest.mark.parametrize("name, columns", [("train.tsv", ["drugName", "review"]), ("train.jsonl", ["review"])])
def test_a_compressed_file_reads_as_the_plain_one(data_dir, tmp_path, name, columns):
    """finetune / predict / sbert data as .csv.gz, .tsv.xz, .jsonl.gz: the suffix before .gz picks the format."""
    import gzip
    import lzma

    plain = tmp_path / name
    if name.endswith(".jsonl"):
        tsv = read_rows(data_dir / "drug-reviews" / "train.tsv", text_columns=["review"], label_column="rating")
        plain.write_text("".join(json.dumps({"review": t[0], "rating": label}) + "\n"
                                 for t, label in zip(tsv.texts, tsv.labels)), encoding="utf-8")
    else:
        plain.write_bytes((data_dir / "drug-reviews" / name).read_bytes())
    expected = read_rows(plain, text_columns=columns, label_column="rating")
    for suffix, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
        packed = tmp_path / f"{name}{suffix}"
        packed.write_bytes(compress(plain.read_bytes()))
        rows = read_rows(packed, text_columns=columns, label_column="rating")
        assert (rows.texts, rows.labels, rows.row_numbers) == (expected.texts, expected.labels, expected.row_numbers)
    assert len(expected) == 600


def test_bom_quoted_newlines_and_row_numbers(tmp_path):
    # A BOM before the header (Excel writes one) must not become part of the first column's name.
    path = tmp_path / "train.csv"
    path.write_bytes('\ufefftext,label\n"two\nlines",a\n\nplain,b\n'.encode("utf-8"))
    rows = read_rows(path, text_columns=["text"], label_column="label")
    assert rows.texts == [("two\nlines",), ("plain",)]
    assert rows.row_numbers == [2, 5]  # the quoted text spans lines 2-3; line 4 is blank


def test_bad_rows_are_skipped_with_a_warning_naming_file_line_and_column(tmp_path, caplog):
    path = write(tmp_path / "train.csv", "review,label\ngood,pos\n  ,neg\nfine,\nok,pos,extra\nbad,neg\n")
    with caplog.at_level(logging.WARNING):
        rows = read_rows(path, text_columns=["review"], label_column="label")
    assert rows.texts == [("good",), ("bad",)] and rows.labels == ["pos", "neg"] and rows.row_numbers == [2, 6]
    assert rows.skipped == ["train.csv:3: empty text in column 'review'; row skipped",
                            "train.csv:4: empty label in column 'label'; row skipped",
                            "train.csv:5: 3 fields but the header has 2 (an unquoted delimiter or quote inside "
                            "a text?); row skipped"]
    assert "skipped 3 of 5 rows" in caplog.text
    # Without a label column, an empty label does not matter.
    assert len(read_rows(path, text_columns=["review"])) == 3


def test_missing_column_names_the_file_the_column_and_what_was_found(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\nhello\tx\n")
    with pytest.raises(ValueError, match=r"train.tsv: no column 'text' \(found \['sentence', 'label'\]\)"):
        read_rows(path, text_columns=["text"], label_column="label")
    assert read_rows(path, text_columns=["sentence"]).texts == [("hello",)]  # tab-separated by suffix


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_rows(tmp_path / "nope.csv", text_columns=["text"])
    with pytest.raises(ValueError, match="unknown format '.xlsx'"):
        read_rows(write(tmp_path / "a.xlsx", "x"), text_columns=["text"])
    with pytest.raises(ValueError, match="no usable rows"):
        read_rows(write(tmp_path / "empty.csv", "text,label\n ,a\n"), text_columns=["text"], label_column="label")
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("text\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.csv is not UTF-8 text \(line 2, byte 0xE9\); convert it"):
        read_rows(latin1, text_columns=["text"])
    with pytest.raises(ValueError, match="1 to 2 columns"):
        read_rows(write(tmp_path / "b.csv", "a,b,c\n1,2,3\n"), text_columns=["a", "b", "c"])


def test_jsonl_keeps_json_labels_and_skips_null_text(tmp_path):
    lines = [{"text": "red apple", "tags": ["red", "fruit"]}, {"text": None, "tags": ["x"]},
             {"text": "green", "tags": ["green"]}, {"text": "plain", "tags": []}]
    path = write(tmp_path / "train.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n\n")
    rows = read_rows(path, text_columns=["text"], label_column="tags")
    assert rows.labels == [["red", "fruit"], ["green"], []] and rows.row_numbers == [1, 3, 4]
    assert rows.skipped == ["train.jsonl:2: empty text in column 'text'; row skipped"]
    space = LabelSpace.infer(rows.labels)  # lists mean multi-label without being told
    assert space.problem_type == "multi_label_classification" and space.labels == ["fruit", "green", "red"]
    assert space.encode(rows.labels).tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = write(tmp_path / "a.jsonl", '{"text": "ok", "label": 1}\n{"text": "broken"\n')
    with pytest.raises(ValueError, match=r"a.jsonl:2: not valid JSON"):
        read_rows(path, text_columns=["text"], label_column="label")
    with pytest.raises(ValueError, match=r"b.jsonl:1: a JSON list, not an object"):
        read_rows(write(tmp_path / "b.jsonl", '["text"]\n'), text_columns=["text"])
    with pytest.raises(ValueError, match=r"c.jsonl:1: field 'text' holds int, not a str"):
        read_rows(write(tmp_path / "c.jsonl", '{"text": 5}\n'), text_columns=["text"])
    with pytest.raises(ValueError, match=r"d.jsonl:2: no column 'label'"):
        read_rows(write(tmp_path / "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n'),
                  text_columns=["text"], label_column="label")


# ---------------------------------------------------------------- the label space

def test_single_label_ids_follow_sorted_labels_and_integer_labels_sort_by_value():
    space = LabelSpace.infer(["b", "a", "c", "a"])
    assert space.id2label == {0: "a", 1: "b", 2: "c"} and space.label2id == {"a": 0, "b": 1, "c": 2}
    assert space.encode(["c", "a"]).tolist() == [2, 0] and space.encode(["c"]).dtype == torch.long
    numbers = LabelSpace.infer(["10", "2", "1", 10])  # JSON ints and CSV strings name the same class
    assert numbers.labels == ["1", "2", "10"] and numbers.num_labels == 3


def test_one_class_is_an_error_that_says_what_to_check():
    with pytest.raises(ValueError, match="label column has one class 'pos': a classifier needs at least two"):
        LabelSpace.infer(["pos", "pos "])


def test_unknown_labels_are_listed_with_rows_and_the_known_labels():
    space = LabelSpace.infer(["neg", "pos"])
    with pytest.raises(ValueError, match=r"'neutral' \(rows 12, 14\).*known labels: \['neg', 'pos'\]"):
        space.encode(["pos", "neutral", "neutral"], row_numbers=[11, 12, 14])
    multi = LabelSpace.infer(["a|b", "c"], problem_type="multi_label_classification")
    with pytest.raises(ValueError, match=r"'d' \(rows 2\)"):
        multi.encode(["a", "b|d"])


def test_multi_label_cells_split_on_the_separator():
    space = LabelSpace.infer(["drama | comedy", "comedy", "horror;x"], problem_type="multi_label_classification")
    assert space.labels == ["comedy", "drama", "horror;x"]
    encoded = space.encode(["comedy|drama", "horror;x"])
    assert encoded.dtype == torch.float32 and encoded.tolist() == [[1, 1, 0], [0, 0, 1]]
    assert LabelSpace.infer(["a;b", "c"], "multi_label_classification", label_separator=";").labels == ["a", "b", "c"]


def test_cells_joining_labels_make_a_multi_label_task_without_being_told(caplog):
    """The README's "`a|b` in a cell": a CSV's "sunny|rainy" was a class of its own (a 4-class softmax where the
    same data as JSON lists trained multi-label over 3), in finetune and baseline alike, without a word."""
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        space = LabelSpace.infer(["sunny|rainy", "sunny", "rainy", "snowy"])
    assert (space.problem_type, space.labels) == ("multi_label_classification", ["rainy", "snowy", "sunny"])
    assert "1 cells join labels with '|', so the task is multi-label" in caplog.text
    assert LabelSpace.infer(["a|b", "c"], "single_label_classification").labels == ["a|b", "c"]  # when told
    assert LabelSpace.infer(["neg", "pos"]).problem_type == "single_label_classification"


def test_classes_that_look_like_a_numeric_target_are_said_to(caplog):
    """Fractions as labels trained as one class each (154 of them on an STS-like column) without a word."""
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        space = LabelSpace.infer(["0.5", "3.25", "4.0", "0.5"])
    assert space.problem_type == "single_label_classification" and len(space.labels) == 3  # never guessed
    assert "3 distinct numbers such as '0.5', each trained as a class" in caplog.text
    assert "data.problem_type=regression" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        LabelSpace.infer(["0", "1", "2", "1"])  # star ratings, integer classes: nothing to say
    assert "distinct numbers" not in caplog.text


def test_regression_values_must_be_numbers():
    space = LabelSpace.infer(["0.5", "4", 3], problem_type="regression")
    assert space.num_labels == 1 and space.id2label == {0: "LABEL_0"}
    assert space.encode(["0.5", "-2"]).tolist() == [0.5, -2.0]
    with pytest.raises(ValueError, match="regression label 'high' is not a finite number"):
        LabelSpace.infer(["1", "high"], problem_type="regression")
    with pytest.raises(ValueError, match=r"'nan' \(row 7\)"):
        space.encode(["nan"], row_numbers=[7])
    with pytest.raises(ValueError, match="unknown problem_type 'ordinal'"):
        LabelSpace.infer(["1"], problem_type="ordinal")


def test_label_space_round_trips_through_the_model_config():
    for space in (LabelSpace.infer(["b", "a", "c"]), LabelSpace.infer([["x"], ["y", "z"]]),
                  LabelSpace.infer(["1.5", "2"], "regression")):
        config = BertConfig.from_dict(BertConfig(id2label=space.id2label, problem_type=space.problem_type).to_dict())
        rebuilt = LabelSpace.from_config(config)
        assert (rebuilt.problem_type, rebuilt.labels, config.num_labels) == \
               (space.problem_type, space.labels, space.num_labels)
    # transformers' reading of a config without problem_type: one label is regression.
    assert LabelSpace.from_config(BertConfig(id2label={0: "score"})).problem_type == "regression"
    assert LabelSpace.from_config(BertConfig(id2label={1: "b", 0: "a"})).labels == ["a", "b"]
    with pytest.raises(ValueError, match="no id2label"):
        LabelSpace.from_config(BertConfig())
    # a transformers regression of three values: predict wrote the first alone, as if it were the model's answer
    three = BertConfig(id2label={0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, problem_type="regression")
    with pytest.raises(ValueError, match="a regression of 3 values .* reads regression models of one value"):
        LabelSpace.from_config(three)


# ---------------------------------------------------------------- windows

def test_rows_that_fit_match_the_tokenizer_with_special_tokens(tokenizer):
    texts = [("The flight was late.",), ("Loved the crew!",)]
    windows = encode_windows(tokenizer, texts, max_length=32, stride=8)
    assert windows.input_ids == tokenizer([t for t, in texts])["input_ids"]
    assert windows.document_index == [0, 1] and windows.attention_mask[1] == [1] * len(windows.input_ids[1])
    pairs = [("Is it late?", "The flight was late."), ("A", "B c")]
    encoded = encode_windows(tokenizer, pairs, max_length=32)
    reference = tokenizer([a for a, _ in pairs], [b for _, b in pairs])
    assert encoded.input_ids == reference["input_ids"] and encoded.token_type_ids == reference["token_type_ids"]
    assert encoded.truncated_pairs == 0


def test_a_long_text_becomes_overlapping_windows(tokenizer):
    words = NUMBERS.split()[:20]
    pieces = tokenizer.convert_tokens_to_ids(words)
    # max_length 10 → 8 pieces a window, 2 shared: windows start at 0, 6, 12 and the last ends at 20.
    windows = encode_windows(tokenizer, [("short",), (" ".join(words),)], max_length=10, stride=2)
    assert windows.document_index == [0, 1, 1, 1]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert windows.input_ids[1:] == [[cls, *pieces[0:8], sep], [cls, *pieces[6:14], sep], [cls, *pieces[12:20], sep]]
    # One more piece needs a fourth, shorter window.
    longer = encode_windows(tokenizer, [(" ".join(words + ["hello"]),)], max_length=10, stride=2)
    assert [len(ids) for ids in longer.input_ids] == [10, 10, 10, 2 + 3]  # pieces 18-20
    capped = encode_windows(tokenizer, [(" ".join(words),), ("short",)], max_length=10, stride=2, max_windows=2)
    assert capped.document_index == [0, 0, 1] and capped.capped_documents == 1
    assert capped.input_ids[1] == [cls, *pieces[6:14], sep]


def test_long_pairs_are_truncated_longest_first(tokenizer):
    words = NUMBERS.split()
    pieces = tokenizer.convert_tokens_to_ids(words[:10])
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    # 10 + 3 pieces into 12 - 3 = 9: the longer loses 4 → 6 + 3.
    windows = encode_windows(tokenizer, [(" ".join(words[:10]), "one two three"), ("a", "b")], max_length=12)
    assert windows.input_ids[0] == [cls, *pieces[:6], sep, *pieces[:3], sep]
    assert windows.token_type_ids[0] == [0] * 8 + [1] * 4
    assert windows.truncated_pairs == 1 and windows.document_index == [0, 1]
    # 5 + 5 into 7: each half, the odd piece to B (transformers' fast tokenizer; BERT's original loop gave it to A).
    tie = encode_windows(tokenizer, [(" ".join(words[:5]), " ".join(words[5:10]))], max_length=10)
    assert tie.input_ids[0] == [cls, *pieces[:3], sep, *pieces[5:9], sep]


def test_pairs_are_cut_as_transformers_fast_tokenizer_cuts_them(minilm_dir):
    """The server tokenizes a pair with `tokenizers` (longest_first), finetune / predict / search --rerank by
    encode_windows: on an odd budget they gave the odd piece to different texts (scores 0.0937 against 0.0946)."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ours = BertTokenizer.from_pretrained(minilm_dir)
    pairs = [(" ".join(["cat"] * a), " ".join(["dog"] * b)) for a in (1, 4, 7, 12, 30) for b in (1, 5, 7, 13, 29)]
    for max_length in (8, 11, 16, 23, 40):
        expected = theirs([a for a, _ in pairs], [b for _, b in pairs], truncation="longest_first",
                          max_length=max_length)["input_ids"]
        assert encode_windows(ours, pairs, max_length=max_length).input_ids == expected, max_length


def test_collate_pads_to_the_longest_and_hands_out_document_labels(tokenizer):
    windows = encode_windows(tokenizer, [("hello",), (" ".join(NUMBERS.split()[:12]),)], max_length=8, stride=2,
                             labels=torch.tensor([3, 7]))
    assert windows.document_index == [0, 1, 1, 1]
    batch = windows.collate([0, 2])
    assert batch["input_ids"].shape == (2, 8) and batch["input_ids"].dtype == torch.long
    assert batch["input_ids"][0].tolist()[3:] == [tokenizer.pad_token_id] * 5
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8]
    assert batch["labels"].tolist() == [3, 7]
    assert set(pad_batch(windows, [1]).keys()) == {"input_ids", "token_type_ids", "attention_mask", "labels"}


def test_window_argument_errors(tokenizer):
    with pytest.raises(ValueError, match="same number of texts"):
        encode_windows(tokenizer, [("a",), ("b", "c")])
    with pytest.raises(ValueError, match=r"stride .* \[0, 8\)"):
        encode_windows(tokenizer, [("a",)], max_length=10, stride=8)
    with pytest.raises(ValueError, match=r"max_length must be at least 5, got 4 \(\[CLS\], \[SEP\]s"):
        encode_windows(tokenizer, [("a", "b")], max_length=4)
    with pytest.raises(ValueError, match="2 labels for 1 rows"):
        encode_windows(tokenizer, [("a",)], labels=torch.tensor([0, 1]))


def test_id_column_travels_with_its_rows(tmp_path):
    path = tmp_path / "chunks.csv"
    path.write_text("ID,TEXT,Label\n7,first chunk,1\n7,,1\n9,other admission,0\n", encoding="utf-8")
    rows = read_rows(path, text_columns=["TEXT"], label_column="Label", id_column="ID")
    assert rows.ids == ["7", "9"] and rows.labels == ["1", "0"]  # the empty chunk is skipped with its id
