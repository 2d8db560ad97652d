"""Reading raw corpora into documents of sentences: layouts, sentence splitting, errors."""
import gzip
import json
import types

import pytest

from bertforge.input_files import blank_line_blocks
from bertforge.tasks.pretraining import read_documents, split_lines, split_sentences


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- sentence splitting

def test_split_sentences_keeps_titles_and_splits_quoted_speech():
    # Lines from Pride and Prejudice, hard-wrapped as in the file.
    paragraph = ('"Oh! Single, my dear, to be sure! A single man of large fortune; four or\n'
                 'five thousand a year. What a fine thing for our girls!"')
    assert split_sentences(paragraph) == ['"Oh!', "Single, my dear, to be sure!",
                                          "A single man of large fortune; four or five thousand a year.",
                                          'What a fine thing for our girls!"']
    assert split_sentences("Mr. Bennet replied that he had not. Mrs. Long has just been here. "
                           "Mr. Darcy bowed.") == ["Mr. Bennet replied that he had not.",
                                                   "Mrs. Long has just been here.", "Mr. Darcy bowed."]
    assert split_sentences("She went to St. James's with Dr. Grant. They returned.") == [
        "She went to St. James's with Dr. Grant.", "They returned."]
    assert split_sentences("  \n ") == []


def test_split_sentences_on_a_whole_novel_rarely_breaks_after_a_title(data_dir):
    text = (data_dir / "austen" / "prideprejudice.txt").read_text(encoding="utf-8")
    sentences = [s for block in text.split("\n\n") for s in split_sentences(block)]
    after_title = [s for s in sentences if s.endswith((" Mr.", " Mrs.", '"Mr.', "--Mr."))]
    assert 5000 < len(sentences) < 7000
    assert len(after_title) <= 3, after_title


def test_split_lines_is_the_original_one_sentence_per_line_format():
    assert split_lines("First sentence.\n\n  Second one  \nthird\n") == ["First sentence.", "Second one", "third"]


# ---------------------------------------------------------------- layouts

def test_blank_line_documents_join_wrapped_lines(tmp_path):
    path = write(tmp_path / "a.txt", "One line\nwrapped here. Two.\n\n\n\nSecond document.\n \nThird. Doc.")
    documents = read_documents(path)
    assert isinstance(documents, types.GeneratorType)  # streamed, not a list of the whole corpus
    assert list(documents) == [["One line wrapped here.", "Two."], ["Second document."], ["Third.", "Doc."]]


def test_blank_line_blocks_keep_their_lines_and_read_compressed_files(tmp_path):
    """The one reader of blank-line blocks (pretraining's layouts and adapt's passages both use it)."""
    text = "\n\nOne line\nwrapped.\n \t\n\nSecond.\n\nlast, no newline"
    assert list(blank_line_blocks(write(tmp_path / "a.txt", text))) == ["One line\nwrapped.\n", "Second.\n",
                                                                        "last, no newline"]
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as file:
        file.write(text)
    assert list(blank_line_blocks(tmp_path / "a.txt.gz")) == list(blank_line_blocks(tmp_path / "a.txt"))
    assert list(blank_line_blocks(write(tmp_path / "blank.txt", "\n \n"))) == []


def test_file_documents_split_each_paragraph_on_its_own(tmp_path):
    first = write(tmp_path / "a.txt", "Chapter 1\n\nIt is a truth. Universally\nacknowledged.\n")
    second = write(tmp_path / "b.txt", "Another book.\n")
    documents = list(read_documents([first, second], document_boundary="file"))
    # "Chapter 1" has no full stop but still ends at its paragraph.
    assert documents == [["Chapter 1", "It is a truth.", "Universally acknowledged."], ["Another book."]]


def test_chapter_documents_start_at_heading_paragraphs(tmp_path):
    book = ("Title page.\n\nVOLUME I\n\nCHAPTER I\n\nIt is a truth. Universally\nacknowledged.\n\n"
            "Chapter 2\n\nA chapter heading inside a sentence: see chapter IV.\n\nCHAPTER III.\n\nLast one.\n")
    documents = list(read_documents(write(tmp_path / "a.txt", book), document_boundary="chapter"))
    # Front matter is its own document; empty ones (between VOLUME I and CHAPTER I) are skipped.
    assert documents == [["Title page."], ["It is a truth.", "Universally acknowledged."],
                         ["A chapter heading inside a sentence: see chapter IV."], ["Last one."]]
    # A number word is a chapter's number; any other word is text ("Part company." started a new document, dropped)
    book = "Chapter the First\n\nThey met.\n\nPart company.\n\nBook now.\n\nChapter Twenty-One\n\nThe end.\n"
    documents = list(read_documents(write(tmp_path / "b.txt", book), document_boundary="chapter"))
    assert documents == [["They met.", "Part company.", "Book now."], ["The end."]]


def test_folder_means_its_txt_and_jsonl_files_in_name_order(tmp_path):
    write(tmp_path / "b.txt", "Bee.")
    write(tmp_path / "a.jsonl", json.dumps({"text": "Ay."}) + "\n")
    write(tmp_path / "notes.md", "ignored")  # a corpus folder's README.md is about the data, not data
    write(tmp_path / ".hidden.txt", "ignored")
    assert list(read_documents(tmp_path)) == [["Ay."], ["Bee."]]


def test_split_lines_reads_create_pretraining_data_input(tmp_path):
    path = write(tmp_path / "a.txt", "Sentence one. Still one.\nSentence two\n\nDoc two.\n")
    assert list(read_documents(path, split_sentences=split_lines)) == [
        ["Sentence one. Still one.", "Sentence two"], ["Doc two."]]


def test_jsonl_one_document_per_line_paragraphs_by_blank_lines(tmp_path):
    lines = [{"body": "First. Second.\n\nNew paragraph", "id": 1}, {"body": "   "}, {"body": "Other doc."}]
    path = write(tmp_path / "a.jsonl", "\n".join(map(json.dumps, lines)) + "\n\n")
    assert list(read_documents(path, text_field="body")) == [["First.", "Second.", "New paragraph"], ["Other doc."]]


# ---------------------------------------------------------------- errors

def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope.txt does not exist"):
        list(read_documents([tmp_path / "nope.txt"]))


def test_jsonl_line_without_the_field_names_file_and_line(tmp_path):
    path = write(tmp_path / "a.jsonl", '{"text": "ok."}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl:2: a record needs a str 'text' .*keys \['body'\]: name the"):
        list(read_documents(path))


@pytest.mark.parametrize("line, message", [("{not json", "a.jsonl:1: not valid JSON"),
                                           ('{"text": 3}', "a.jsonl:1: a record needs a str 'text'"),
                                           ('["text"]', "a.jsonl:1: a JSON list, not an object")])
def test_bad_jsonl_lines(tmp_path, line, message):
    path = write(tmp_path / "a.jsonl", line + "\n")
    with pytest.raises(ValueError, match=message):
        list(read_documents(path))


def test_unknown_document_boundary(tmp_path):
    with pytest.raises(ValueError, match="unknown document_boundary 'paragraph'"):
        list(read_documents(write(tmp_path / "a.txt", "x"), document_boundary="paragraph"))


def test_empty_folder(tmp_path):
    with pytest.raises(ValueError, match=r"has no \.txt, \.jsonl files"):
        list(read_documents(tmp_path))
