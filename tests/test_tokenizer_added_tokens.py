"""Tokens added with transformers' `add_tokens` / additional special tokens ("[E1]", "<drug>", "sars-cov-2").

Every door read a folder's added tokens as WordPiece words (transformers 5's tokenizer.json) or not at all
(vocab.txt beside added_tokens.json): "[E1]" became "[ e ##1 ]", and a sentence-transformers model extended with
two tokens embedded a text using them at cosine 0.692 to sentence-transformers' own vector.
"""
import json
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from bertforge import BertTokenizer

TEXT = "[E1] COVID19 [/E1] is caused by sars-cov-2, see <ent>covid19x"
ADDED = ["covid19", "<ent>", "sars-cov-2"]
SPECIAL = ["[E1]", "[/E1]"]


@pytest.fixture(scope="module")
def extended(minilm_dir, tmp_path_factory):
    """all-MiniLM-L6-v2's tokenizer with three tokens and two special tokens added, saved by transformers 5."""
    folder = tmp_path_factory.mktemp("added") / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    tokenizer.add_tokens(ADDED)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.save_pretrained(folder)
    return folder


def test_added_tokens_are_matched_as_transformers_matches_them(extended, minilm_dir):
    theirs = AutoTokenizer.from_pretrained(extended)
    ours = BertTokenizer.from_pretrained(extended)
    expected = theirs(TEXT, return_special_tokens_mask=True)
    got = ours(TEXT, return_special_tokens_mask=True)
    assert got["input_ids"] == expected["input_ids"]
    assert ours.convert_ids_to_tokens(got["input_ids"])[1:4] == ["[E1]", "covid19", "[/E1]"]  # lower-cased match
    assert got["special_tokens_mask"] == expected["special_tokens_mask"]
    assert len(ours) == len(theirs) == 30527
    assert ours.decode(got["input_ids"], skip_special_tokens=True) == theirs.decode(
        expected["input_ids"], skip_special_tokens=True)
    # transformers 4's layout: vocab.txt, added_tokens.json and special_tokens_map.json, no tokenizer.json
    older = extended.parent / "v4"
    older.mkdir()
    shutil.copy(minilm_dir / "vocab.txt", older / "vocab.txt")
    added = {token: 30522 + i for i, token in enumerate(ADDED + SPECIAL)}
    (older / "added_tokens.json").write_text(json.dumps(added), encoding="utf-8")
    (older / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": SPECIAL}),
                                                   encoding="utf-8")
    assert BertTokenizer.from_pretrained(older)(TEXT)["input_ids"] == expected["input_ids"]


def test_a_saved_tokenizer_keeps_its_added_tokens_for_us_and_for_transformers(extended, tmp_path):
    ours = BertTokenizer.from_pretrained(extended)
    ours.save_pretrained(tmp_path / "saved")
    expected = ours(TEXT)["input_ids"]
    assert BertTokenizer.from_pretrained(tmp_path / "saved")(TEXT)["input_ids"] == expected
    assert AutoTokenizer.from_pretrained(tmp_path / "saved")(TEXT)["input_ids"] == expected
    vocab_lines = (tmp_path / "saved" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab_lines) == 30522  # WordPiece's own; the added tokens are tokenizer.json's


def test_a_sentence_transformers_model_with_added_tokens_embeds_as_sentence_transformers(minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    import bertforge

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    model.tokenizer.add_tokens(["covid19", "<drug>"])
    model[0].auto_model.resize_token_embeddings(len(model.tokenizer))
    torch.manual_seed(0)
    with torch.no_grad():  # the new rows as fine-tuning would leave them: their own values
        embeddings = model[0].auto_model.get_input_embeddings().weight
        embeddings[-2:] = torch.randn(2, embeddings.shape[1]) * 0.05
    model.save(str(tmp_path / "extended"))
    texts = ["<drug> made my covid19 symptoms worse", "a text without added tokens"]
    expected = SentenceTransformer(str(tmp_path / "extended"), device="cpu").encode(texts, normalize_embeddings=True)
    ours = np.asarray(bertforge.embed(tmp_path / "extended", texts, progress=False))
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    assert (ours * expected).sum(axis=1).min() > 0.99999


def test_added_tokens_whose_ids_do_not_follow_the_vocabulary_are_refused(extended, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(extended, broken)
    data = json.loads((broken / "tokenizer.json").read_text(encoding="utf-8"))
    next(token for token in data["added_tokens"] if token["content"] == "covid19")["id"] = 40000
    (broken / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="added token '<ent>' has id 30523, but .* the next id 30522"):
        BertTokenizer.from_pretrained(broken)
    with pytest.raises(ValueError, match="added token"):
        BertTokenizer.from_pretrained(extended).with_pieces(["##xyz"])


def test_a_config_reads_the_same_whatever_files_sit_beside_it(minilm_dir, tmp_path):
    """A tokenizer_config.json that does not say do_lower_case, beside a cased tokenizer.json: transformers lower-cases
    where the config names BertTokenizer (its default) and keeps case where it names no class (tokenizer.json as it
    is), vocab.txt or not; bertforge lower-cased with a vocab.txt beside and kept case without one."""
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "BertNormalizer", "lowercase": False, "strip_accents": False,
                          "clean_text": True, "handle_chinese_chars": True}
    for name, with_vocab, config in (("plain", False, {}), ("with_vocab", True, {}),
                                     ("bert", False, {"tokenizer_class": "BertTokenizer"}),
                                     ("bert_with_vocab", True, {"tokenizer_class": "BertTokenizer"})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512, **config}),
                                                      encoding="utf-8")
        if with_vocab:
            shutil.copy(minilm_dir / "vocab.txt", folder / "vocab.txt")
        expected = AutoTokenizer.from_pretrained(folder)("Hello Paris Café")["input_ids"]
        assert BertTokenizer.from_pretrained(folder)("Hello Paris Café")["input_ids"] == expected, name


def test_never_split_survives_a_save_and_a_load(minilm_dir, tmp_path):
    """save_pretrained wrote never_split to tokenizer_config.json and loading never read it back."""
    ours = BertTokenizer.from_pretrained(minilm_dir, never_split=["[unused1]"])
    ours.save_pretrained(tmp_path / "saved")
    again = BertTokenizer.from_pretrained(tmp_path / "saved")
    assert again.never_split == ["[unused1]"]
    assert again.tokenize("see [unused1] here") == ours.tokenize("see [unused1] here") == ["see", "[unused1]", "here"]
