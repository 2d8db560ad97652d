"""One way to open a user's text and tables (bertforge/input_files.py): a byte-order mark dropped, .gz read, the
same message for bytes that are not UTF-8, whichever reader meets the file."""
import csv
import gzip
import json

import pytest

from bertforge.readmission import Report, read_admissions
from bertforge.tasks.classification.reader import read_rows
from bertforge.tasks.ner.conll import read_conll
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.tasks.qa.squad import read_squad
from bertforge.tasks.retrieval.reader import read_qrels
from bertforge.search.documents import read_corpus

BOM = "\ufeff"
ADMISSION_COLUMNS = ["SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE"]
ADMISSION = ["1", "101", "2100-01-01 08:00:00", "2100-01-05 08:00:00", "", "EMERGENCY"]


def admissions_text() -> str:
    return ",".join(ADMISSION_COLUMNS) + "\n" + ",".join(ADMISSION) + "\n"


def write_records(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_byte_order_mark_is_not_part_of_the_first_header_word_or_sentence(tmp_path):
    (tmp_path / "ADMISSIONS.csv").write_text(BOM + admissions_text(), encoding="utf-8")
    assert [a.hadm_id for a in read_admissions(tmp_path / "ADMISSIONS.csv", Report())] == [101]
    (tmp_path / "qrels.tsv").write_text(BOM + "query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    assert read_qrels(tmp_path / "qrels.tsv") == {"q1": {"d1": 1.0}}
    book = tmp_path / "books" / "book.txt"
    book.parent.mkdir()
    book.write_text(BOM + "The first sentence of the book is here. A second one follows it.\n", encoding="utf-8")
    assert next(read_documents(book))[0] == "The first sentence of the book is here."
    copy = tmp_path / "books" / "copy.txt"
    copy.write_text(book.read_text(encoding="utf-8").lstrip(BOM), encoding="utf-8")
    corpus = read_corpus([book.parent])  # the copy without the mark is the same passage: a duplicate
    assert corpus.duplicates == 1 and not corpus.passages[0].text.startswith(BOM)


def test_compressed_tables_conll_and_squad_read_as_their_plain_files(tmp_path):
    with gzip.open(tmp_path / "ADMISSIONS.csv.gz", "wt", encoding="utf-8") as file:  # as PhysioNet ships MIMIC
        file.write(admissions_text())
    assert [a.hadm_id for a in read_admissions(tmp_path / "ADMISSIONS.csv.gz", Report())] == [101]
    with gzip.open(tmp_path / "ok.conll.gz", "wt", encoding="utf-8") as file:
        file.write("Paris\tB-LOC\nis\tO\n\n")
    assert [(s.words, s.tags) for s in read_conll(tmp_path / "ok.conll.gz")] == [(["Paris", "is"], ["B-LOC", "O"])]
    squad = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Paris is big.", "qas": [
        {"id": "q1", "question": "What is big?", "answers": [{"text": "Paris", "answer_start": 0}]}]}]}]}
    with gzip.open(tmp_path / "squad.json.gz", "wt", encoding="utf-8") as file:
        file.write(BOM + json.dumps(squad))
    assert [e.question for e in read_squad(tmp_path / "squad.json.gz")] == ["What is big?"]


@pytest.mark.parametrize("name", ["rows.csv", "rows.jsonl", "tags.conll", "squad.json", "notes.txt"])
def test_bytes_that_are_not_utf8_get_one_message_naming_the_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes({
        "rows.csv": b"text,label\nfine,1\ncaf\xe9,0\n",
        "rows.jsonl": b'{"text": "fine", "label": 1}\n{"text": "caf\xe9", "label": 0}\n',
        "tags.conll": b"Paris\tB-LOC\ncaf\xe9\tO\n",
        "squad.json": b'{"data": [\n"caf\xe9"]}',
        "notes.txt": b"A fine first line of the notes.\n\ncaf\xe9 and more words in a second block.\n",
    }[name])
    read = {"rows.csv": lambda: read_rows(path, text_columns=["text"], label_column="label"),
            "rows.jsonl": lambda: read_rows(path, text_columns=["text"], label_column="label"),
            "tags.conll": lambda: read_conll(path), "squad.json": lambda: read_squad(path),
            "notes.txt": lambda: read_corpus([path])}[name]
    line = 3 if name in ("rows.csv", "notes.txt") else 2
    with pytest.raises(ValueError, match=rf"{name} is not UTF-8 text \(line {line}, byte 0xE9\); convert it, e.g. "
                                         rf"iconv -f latin1 -t utf-8 .*{name} > new-file"):
        read()


def test_a_table_read_by_every_reader_takes_its_delimiter_from_its_suffix(tmp_path):
    tsv = tmp_path / "rows.tsv"
    with open(tsv, "w", encoding="utf-8", newline="") as file:
        csv.writer(file, delimiter="\t").writerows([["text", "label"], ["a, b", "1"]])
    assert read_rows(tsv, text_columns=["text"], label_column="label").texts == [("a, b",)]


def test_every_corpus_reader_reads_a_jsonl_record_by_the_one_rule(tmp_path):
    """corpus_record for pretraining and train-tokenizer too: the text under the field asked for or `text`, never
    the record's keys; the title before the text (`titled`), in pretraining's corpus as in the vocabulary trained
    for it (the corpus left it out while the vocabulary learnt its words)."""
    from bertforge.tokenization.vocab_training import train_vocab

    records = [{"_id": f"zzid{i}", "title": "Quokkas", "text": f"Quokka number {i} smiles at wombats."}
               for i in range(20)]
    corpus = write_records(tmp_path / "corpus.jsonl", records)
    assert next(read_documents(corpus, text_field="body")) == ["Quokkas Quokka number 0 smiles at wombats."]
    vocab = train_vocab([corpus], vocab_size=200, min_frequency=2)
    assert "quokka" in vocab and "wombats" in vocab
    assert not {"zzid", "_id", "title"} & set(vocab)  # the record's keys and ids are not its text
    with pytest.raises(ValueError, match="corpus.jsonl:1: a record needs a str 'body'"):
        train_vocab([write_records(tmp_path / "corpus.jsonl", [{"body": 3}])], vocab_size=200, text_field="body")


def test_a_page_entities_are_decoded_once(tmp_path):
    """A page's parser decodes its entities: "&amp;lt;b&amp;gt;" on a page is the text "<b>" written out, which
    adapt and index build read as pretraining does; a table's scraped cells are decoded (&#039; in reviews)."""
    (tmp_path / "page.html").write_text("<html><body><p>Write &amp;lt;b&amp;gt; for bold text in a page, as the "
                                        "manual of this site says.</p></body></html>", encoding="utf-8")
    (tmp_path / "rows.tsv").write_text("review\nWouldn&#039;t stop the pain at all, said the patient.\n",
                                       encoding="utf-8")
    texts = {p.id.split(":")[0]: p.text for p in read_corpus([tmp_path], text_column="review").passages}
    assert texts["page.html"].startswith("Write &lt;b&gt; for bold")
    assert next(read_documents(tmp_path / "page.html"))[0].startswith("Write &lt;b&gt; for bold")
    assert texts["rows.tsv"].startswith("Wouldn't stop")


def test_a_folder_given_for_a_file_is_called_a_folder_with_what_the_file_should_be(tmp_path):
    from bertforge.search.corpus import check_corpus_file
    from bertforge.tasks.retrieval.reader import read_texts_by_id

    with pytest.raises(ValueError, match=r"is a folder; pass a file \(a retrieval set needs queries.jsonl"):
        read_texts_by_id(tmp_path)
    with pytest.raises(ValueError, match=r"qrels file .*nope.tsv does not exist; .*BEIR's are qrels/test.tsv"):
        read_qrels(tmp_path / "nope.tsv")
    with pytest.raises(ValueError, match=r"corpus .* is a folder; pass a file \(a text file \(one passage per line\)"):
        check_corpus_file(tmp_path)
