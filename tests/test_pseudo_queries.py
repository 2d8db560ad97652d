"""adapt's generated queries (GPL-style): a doc2query model's queries as ICT anchors, generation as a cached,
resumable, budgeted stage, and the query generator end to end through `bertforge adapt --query-generator`.

The generator here is a tiny T5 with random weights and a word-level tokenizer (random words: the plumbing, not a
measurement; no doc2query model is available offline, so what real ones add is left to measure)."""
import json

import numpy as np
import pytest
import torch

from bertforge.search.documents import Passage
from bertforge.adapt.ict import IctCollator
from bertforge.search.documents import passage_text
from bertforge.adapt.pseudo_queries import (PLAN_FILE, QUERIES_FILE, QueryGenerator, QuerySettings, drawing_order,
                                            generate_queries, read_queries)
from bertforge.cli.parser import main
from bertforge.tokenization.tokenizer import BertTokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("faiss")

WORDS = "how do i make a python script run on unix why is the list slow what does import mean".split()


@pytest.fixture(scope="module")
def generator_dir(tmp_path_factory):
    """A T5ForConditionalGeneration of 2 tiny layers and its fast tokenizer, saved as a hub folder is."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder = tmp_path_factory.mktemp("t5")
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(dict.fromkeys(WORDS))}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(folder)
    config = transformers.T5Config(vocab_size=len(vocab), d_model=16, d_ff=32, d_kv=8, num_layers=1,
                                   num_decoder_layers=1, num_heads=2, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def generator(generator_dir):
    return QueryGenerator(str(generator_dir), torch.device("cpu"))


def passages_of(count: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, 12)) + f" passage {i}." for i in range(count)]


def test_queries_are_distinct_non_empty_and_the_same_for_the_same_seed(generator):
    settings = QuerySettings(per_passage=3, max_query_tokens=6)
    first = generator.queries(passages_of(4), settings, seed=5)
    assert len(first) == 4
    assert all(1 <= len(queries) <= 3 and len(set(queries)) == len(queries) and all(q.strip() for q in queries)
               for queries in first)
    assert generator.queries(passages_of(4), settings, seed=5) == first
    state = torch.random.get_rng_state()
    generator.queries(passages_of(4), settings, seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random stream is left alone


def test_generation_writes_a_line_per_passage_in_a_seeded_order_and_a_resume_writes_the_same(generator, tmp_path):
    texts, passages = passages_of(20), list(range(0, 20, 2)) + [1]  # 11 of the 20 are training passages
    settings = QuerySettings(per_passage=2, max_query_tokens=5, batch_size=4, seed=3)
    whole = generate_queries(generator, texts, passages, settings, tmp_path / "whole")
    assert sorted(whole) == sorted(passages)  # every one (a random T5 always writes some word)
    rows = [json.loads(line) for line in (tmp_path / "whole" / QUERIES_FILE).read_text().splitlines()]
    assert [row["passage"] for row in rows] == drawing_order(passages, 3) != sorted(passages)

    # A kill after the first batch, in the middle of writing the next line: the partial line is cut, the rest drawn
    killed = tmp_path / "killed"
    killed.mkdir()
    lines = (tmp_path / "whole" / QUERIES_FILE).read_text().splitlines(keepends=True)
    (killed / QUERIES_FILE).write_text("".join(lines[:4]) + lines[4][:10])
    (killed / PLAN_FILE).write_text((tmp_path / "whole" / PLAN_FILE).read_text())
    assert generate_queries(generator, texts, passages, settings, killed) == whole
    assert (killed / QUERIES_FILE).read_text() == (tmp_path / "whole" / QUERIES_FILE).read_text()


def test_a_time_budget_keeps_the_passages_that_fit_and_a_resume_keeps_the_plan(generator, tmp_path, capsys):
    texts, passages = passages_of(40), list(range(40))
    settings = QuerySettings(per_passage=1, max_query_tokens=4, batch_size=4)
    generated = generate_queries(generator, texts, passages, settings, tmp_path, seconds=1e-6)
    assert len(generated) == 4  # the timed first batch is kept; nothing more fits
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert plan["passages"] == 4 and plan["of"] == 40 and plan["passage_seconds"] > 0
    assert "queries for 4 of 40 passages" in capsys.readouterr().out
    assert generate_queries(generator, texts, passages, settings, tmp_path, seconds=1e6) == generated


def test_ict_draws_generated_queries_against_the_whole_passage_and_is_unchanged_without_them(cassette_dir):
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    corpus = [Passage(f"p{i}", [f"First sentence of passage {i} here.", f"Second sentence of passage {i} here.",
                                f"Third sentence of passage {i} here."]) for i in range(6)]
    examples = list(range(6))
    plain = IctCollator(corpus, examples, tokenizer, 64, seed=1)
    generated = {i: [f"query for {i}", f"another query {i}"] for i in (0, 2, 4)}
    mixed = IctCollator(corpus, examples, tokenizer, 64, seed=1, generated=generated, generated_share=1.0)
    none_drawn = IctCollator(corpus, examples, tokenizer, 64, seed=1, generated=generated, generated_share=0.0)
    batch = list(range(6))

    def texts(collate, column):
        return tokenizer.batch_decode(collate(batch)[f"{column}_input_ids"], skip_special_tokens=True)

    anchors, positives = texts(mixed, "anchor"), texts(mixed, "positive")
    for i in batch:
        if i in generated:
            assert anchors[i] in generated[i] and positives[i] == passage_text(corpus[i]).lower()
        else:
            assert "sentence of passage" in anchors[i]
    assert texts(plain, "anchor") == texts(none_drawn, "anchor")  # share 0: ICT as it was
    # Passages without queries draw the same numbers with or without them: ICT's batches are unchanged there
    assert [a for i, a in enumerate(texts(plain, "anchor")) if i not in generated] == \
        [a for i, a in enumerate(texts(IctCollator(corpus, examples, tokenizer, 64, seed=1, generated={},
                                                   generated_share=1.0), "anchor")) if i not in generated]


def test_a_missing_or_wrong_generator_is_one_line_before_anything_runs(cassette_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a name that is no folder is looked for on the hub: not here
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "book.txt").write_text("\n\n".join(f"The garden walk {i} was long. The rain came at {i}. It stopped "
                                                 f"at noon {i}." for i in range(30)) + "\n")
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for wrong in (not_a_model, tmp_path / "bert", tmp_path / "nowhere"):
        code = main(["adapt", str(corpus), "--output", str(tmp_path / "out"), "--base", str(cassette_dir),
                     "--query-generator", str(wrong)])
        err = capsys.readouterr().err
        assert code != 0 and "--query-generator" in err and "doc2query" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()  # refused before the output folder was claimed


@pytest.mark.slow  # two adapt runs (13 s of a core): make test-slow
def test_adapt_with_a_query_generator_trains_ict_on_its_queries_and_reuses_them(generator_dir, cassette_dir,
                                                                                 tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    words = "garden letter carriage ball dinner walk sister friend rain music house evening visit news".split()
    (corpus / "book.txt").write_text("\n\n".join(" ".join(f"The {' '.join(rng.choice(words, 6))} number {p} part "
                                                          f"{s} was noted." for s in range(4)) for p in range(30)))
    argv = ["adapt", str(corpus), "--output", str(tmp_path / "out"), "--base", str(cassette_dir), "--mlm", "off",
            "--device", "cpu", "--query-generator", str(generator_dir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "stage queries: 3 per passage" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    queries = report["generated_queries"]
    assert queries["passages"] == queries["of"] > 0 and queries["queries"] >= queries["passages"]
    assert not any(line.startswith("GPL") for line in report["skipped"])
    ict = next(s for s in report["systems"] if s["name"] == "ict")
    assert ict["settings"]["generated_share"] == 0.5 and "generated queries" in ict["description"]
    assert "Generated queries:" in (tmp_path / "out" / "report.md").read_text()
    stage = next((tmp_path / "out" / "stages").glob("queries-*"))
    assert read_queries(stage) and len(read_queries(stage)) == queries["passages"]
    assert main(argv) == 0  # a second run reuses the queries and the stages trained on them
    again = capsys.readouterr().out
    assert "stage queries:" not in again and "stage ict:" not in again
