"""Sentence-encoder data: readers and their errors, the committed retrieval sets, the sbert CLI."""
import json
from pathlib import Path

import pytest

from bertforge.cli.parser import main
from bertforge.tasks.retrieval.reader import RetrievalSet, read_pairs, read_retrieval_set, write_retrieval_set
from bertforge.tasks.retrieval.sets import SETS, build_set, prepare_set, tweet_key

SPLITS = Path(__file__).resolve().parents[1] / "data" / "retrieval"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_pairs_triplets_and_scored_pairs_from_each_format(tmp_path):
    pairs = read_pairs(write(tmp_path / "p.csv", "anchor,positive\nhow old,what age\nhi,hello\n"))
    assert (pairs.anchors, pairs.positives, pairs.negatives) == (["how old", "hi"], ["what age", "hello"], None)
    triplets = read_pairs(write(tmp_path / "t.tsv", "anchor\tpositive\tnegative\na\tb\tc\n"))
    assert triplets.negatives == ["c"]
    scored = read_pairs(write(tmp_path / "s.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 4.5}\n'), scored=True)
    assert scored.scores == [4.5]
    renamed = read_pairs(write(tmp_path / "r.csv", "q,d,label\nx,y,1\n"), ["q", "d", "label"], scored=True)
    assert (renamed.anchors, renamed.scores) == (["x"], [1.0])


@pytest.mark.parametrize("name, text, scored, message", [
    ("empty.csv", "", False, "is empty"),
    ("header-only.csv", "anchor,positive\n", False, "no usable rows"),
    ("missing.csv", "anchor,answer\na,b\n", False, "no column 'positive'"),
    ("pairs.csv", "anchor,positive\na,b\n", True, "looks like a pair file, but this loss trains on scored pairs"),
    ("triplets.jsonl", '{"anchor": "a", "positive": "b", "negative": "c"}\n', True, "looks like a triplet file"),
    ("bad-score.csv", "sentence1,sentence2,score\na,b,high\n", True, "bad-score.csv:2: score 'high' is not a finite"),
    ("data.txt", "a b\n", False, "unknown format"),
])
def test_bad_training_files_are_one_clear_error(tmp_path, name, text, scored, message):
    with pytest.raises(ValueError, match=message):
        read_pairs(write(tmp_path / name, text), scored=scored)


def test_retrieval_set_reading_and_its_errors(tmp_path):
    write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "cat"}\n{"_id": "q2", "text": "no answer"}\n')
    write(tmp_path / "corpus.jsonl", '{"_id": "d1", "title": "Cats", "text": "a cat"}\n{"_id": "d2", "text": "dog"}\n')
    write(tmp_path / "qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n")
    loaded = read_retrieval_set(tmp_path / "queries.jsonl", tmp_path / "corpus.jsonl", tmp_path / "qrels.tsv")
    assert (loaded.query_ids, loaded.corpus, loaded.relevant) == (["q1"], ["Cats a cat", "dog"], {"q1": {"d1": 1.0}})
    write(tmp_path / "some-missing.tsv", "q1\td9\t1\nq1\td1\t1\n")  # kept: d9 counts as never found (BEIR's sets)
    kept = read_retrieval_set(tmp_path / "queries.jsonl", tmp_path / "corpus.jsonl", tmp_path / "some-missing.tsv")
    assert kept.relevant == {"q1": {"d9": 1.0, "d1": 1.0}}
    write(tmp_path / "bad-qrels.tsv", "q1\td9\t1\n")  # none of its documents in the corpus: ids that do not match
    with pytest.raises(ValueError, match="none of the documents it names is in .* \\(e.g. 'd9'\\)"):
        read_retrieval_set(tmp_path / "queries.jsonl", tmp_path / "corpus.jsonl", tmp_path / "bad-qrels.tsv")
    write(tmp_path / "bad-corpus.jsonl", '{"id": "d1", "text": "x"}\n')
    with pytest.raises(ValueError, match="bad-corpus.jsonl:1: a record needs its id under '_id'"):
        read_retrieval_set(tmp_path / "queries.jsonl", tmp_path / "bad-corpus.jsonl", tmp_path / "qrels.tsv")


@pytest.mark.parametrize("name", SETS)
def test_committed_splits_are_what_their_recipe_draws(data_dir, name):
    """data/retrieval/NAME.json is reproducible from the shared data by sets.build_set (seed 0)."""
    committed = json.loads((SPLITS / f"{name}.json").read_text(encoding="utf-8"))
    assert build_set(name, data_dir) == committed


def test_splits_do_not_leak(data_dir):
    reviews = json.loads((SPLITS / "drug-reviews.json").read_text())
    train_ids = {i for row in reviews["train"] for i in row[:2]}
    for part in ("dev", "test"):
        assert not train_ids & set(reviews[part]["queries"])
        assert all(q not in docs for q, docs in reviews[part]["relevant"].items())
    austen = json.loads((SPLITS / "austen.json").read_text())
    assert {row[0].split(":")[0] for row in austen["train"]} == {"emma", "mansfieldpark", "prideprejudice",
                                                                 "sensesensibility"}
    for query, (following,) in austen["test"]["relevant"].items():
        novel, paragraph, index = query.split(":")
        assert (novel, following) == ("persuasion", f"{novel}:{paragraph}:{int(index) + 1}")


def test_prepared_files_hold_the_real_texts(data_dir, tmp_path):
    ids = json.loads((SPLITS / "tweets.json").read_text())
    counts = prepare_set(ids, data_dir, tmp_path)
    assert counts["train.jsonl"] == len(ids["train"])
    test = read_retrieval_set(tmp_path / "test" / "queries.jsonl", tmp_path / "test" / "corpus.jsonl",
                              tmp_path / "test" / "qrels.tsv")
    texts = dict(zip(test.corpus_ids, test.corpus))
    for query_id, query in zip(test.query_ids[:50], test.queries[:50]):
        assert query.startswith("RT @")
        original = texts[next(iter(test.relevant[query_id]))]  # the first judged
        assert tweet_key(query.split(":", 1)[1]) == tweet_key(original)


@pytest.mark.parametrize("name, files", [("tweets", ["tweets-sentiment/tweets.csv"]),
                                         ("drug-reviews", ["drug-reviews/train.tsv", "drug-reviews/test.tsv"])])
def test_gzipped_demo_data_gives_the_same_set(data_dir, tmp_path, name, files):
    """data_file finds FILE.gz under --data; its reader used to open that as plain text ("not UTF-8")."""
    import gzip

    for relative in files:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{relative}.gz").write_bytes(gzip.compress((data_dir / relative).read_bytes()))
    assert build_set(name, tmp_path) == build_set(name, data_dir)


@pytest.mark.parametrize("name", ["pairs.csv", "pairs.jsonl"])
def test_a_gzipped_pairs_file_reads_as_the_plain_one(tmp_path, name):
    import gzip

    rows = [("the cat sat", "a cat was sitting", "a dog ran"), ("rain today", "it is raining", "sunny skies")]
    plain = tmp_path / name
    if name.endswith(".csv"):
        plain.write_text("anchor,positive,negative\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8")
    else:
        plain.write_text("".join(json.dumps(dict(zip(("anchor", "positive", "negative"), r))) + "\n" for r in rows),
                         encoding="utf-8")
    packed = tmp_path / f"{name}.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected, actual = read_pairs(plain), read_pairs(packed)
    assert (actual.anchors, actual.positives, actual.negatives) == (expected.anchors, expected.positives,
                                                                    expected.negatives)
    assert expected.negatives == [r[2] for r in rows]


def test_cli_prepare_evaluate_and_train(data_dir, cassette_dir, tmp_path, capsys):
    assert main(["sbert", "prepare", "drug-reviews", "--output", str(tmp_path / "set"), "--data", str(data_dir)]) == 0
    assert "train.jsonl" in capsys.readouterr().out
    assert main(["sbert", "evaluate", "--model", "bm25", "--data", str(tmp_path / "set" / "dev"),
                 "--output", str(tmp_path / "bm25.json")]) == 0
    bm25 = json.loads((tmp_path / "bm25.json").read_text())
    assert set(bm25) == {"recall@1", "recall@10", "mrr@10", "ndcg@10"} and 0 < bm25["ndcg@10"] < 1
    recipe = write(tmp_path / "recipe.yaml", f"init_from: {cassette_dir}\nmax_length: 32\nloss:\n  loss: cosent\n"
                   f"data:\n  train: set/train-scored.jsonl\n  dev: set/dev-scored.jsonl\n"
                   "training:\n  max_steps: 3\n  tensorboard: false\n  plot: false\n")
    assert main(["sbert", "train", "--config", str(recipe), "--output", str(tmp_path / "run"), "batch_size=8"]) == 0
    assert "dev: spearman" in capsys.readouterr().out
    assert main(["sbert", "evaluate", "--model", str(tmp_path / "run" / "best"),
                 "--data", str(tmp_path / "set" / "dev-scored.jsonl")]) == 0
    assert capsys.readouterr().out.startswith("spearman ")


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    write(tmp_path / "pairs.csv", "anchor,positive\na,b\n")
    recipe = write(tmp_path / "recipe.yaml", "loss:\n  loss: cosent\ndata:\n  train: pairs.csv\n")
    assert main(["sbert", "train", "--config", str(recipe), "--output", str(tmp_path / "run")]) == 1  # bad data
    assert not (tmp_path / "run").exists()  # (2 is for command-line mistakes)
    error = capsys.readouterr().err
    assert error.startswith("bertforge: error:") and "looks like a pair file" in error and len(error.splitlines()) == 1
    assert main(["sbert", "prepare", "wikipedia", "--output", str(tmp_path)]) == 2
    assert "unknown retrieval set" in capsys.readouterr().err


def test_sbert_train_keeps_the_output_folder_policy_and_prints_its_config(tmp_path, capsys, cassette_dir):
    """A second run into a finished run's folder refuses and changes nothing; --print-config reads back."""
    write(tmp_path / "pairs.csv", "anchor,positive\nthe cat sat,a cat was sitting\nrain today,it is raining\n")
    recipe = write(tmp_path / "recipe.yaml", f"init_from: {cassette_dir}\nmax_length: 16\nbatch_size: 2\n"
                   "data:\n  train: pairs.csv\ntraining:\n  max_steps: 1\n  tensorboard: false\n  plot: false\n")
    run = tmp_path / "run"
    assert main(["sbert", "train", "--config", str(recipe), "--output", str(run)]) == 0
    files = lambda: {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".bertforge.lock"}
    before = files()
    capsys.readouterr()
    assert main(["sbert", "train", "--config", str(recipe), "--output", str(run)]) == 2
    error = capsys.readouterr().err
    assert "--resume" in error and "--overwrite" in error and len(error.splitlines()) == 1
    assert files() == before
    assert main(["sbert", "train", "--config", str(recipe), "--output", str(run), "--overwrite"]) == 0
    capsys.readouterr()

    assert main(["sbert", "train", "--config", str(recipe), "--output", str(tmp_path / "other"), "epochs=3",
                 "--print-config"]) == 0
    printed = write(tmp_path / "printed.yaml", capsys.readouterr().out)
    assert not (tmp_path / "other").exists()
    from bertforge.tasks.retrieval.recipe import SbertRecipe
    again = SbertRecipe.from_file(printed)
    assert (again.epochs, again.training.output_dir, again.data.train) == (3.0, str(tmp_path / "other"),
                                                                           str(tmp_path / "pairs.csv"))


def test_without_dev_the_last_model_ships_even_over_an_earlier_run(tmp_path, cassette_dir):
    from safetensors.torch import load_file

    from bertforge.tasks.retrieval.recipe import SbertRecipe, run_sbert_training

    write(tmp_path / "pairs.csv", "anchor,positive\nthe cat sat,a cat was sitting\nrain today,it is raining\n")
    for seed in (0, 1):
        run_sbert_training(SbertRecipe.from_values({
            "init_from": str(cassette_dir), "max_length": 16, "batch_size": 2, "data": {"train": "pairs.csv"},
            "training": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "learning_rate": 1e-3, "seed": seed,
                         "tensorboard": False, "plot": False}}, base=tmp_path), overwrite=seed == 1)
    shipped = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    last = load_file(str(tmp_path / "run" / "step-000002" / "model" / "model.safetensors"))
    assert shipped.keys() == last.keys() and all(torch_equal(shipped[k], last[k]) for k in shipped)


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_each_split_reads_its_own_beir_qrels_and_says_when_it_reads_the_others(tmp_path, caplog):
    """One BEIR folder, qrels/dev.tsv and qrels/test.tsv: data.dev (and index weight --tune) picks by dev, data.test
    and adapt --eval report test. The dev set of a folder with only test judgments picked checkpoints on the
    reported scores without a word; MS MARCO's only split is dev."""
    from bertforge.tasks.retrieval.reader import beir_qrels
    from bertforge.tasks.retrieval.recipe import load_held_out

    write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "cat"}\n{"_id": "q2", "text": "dog"}\n')
    write(tmp_path / "corpus.jsonl", '{"_id": "d1", "text": "a cat"}\n{"_id": "d2", "text": "a dog"}\n')
    (tmp_path / "qrels").mkdir()
    write(tmp_path / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with caplog.at_level("WARNING", logger="bertforge"):
        assert load_held_out(str(tmp_path), "test").query_ids == ["q1"] and not caplog.text
        assert load_held_out(str(tmp_path), "dev").query_ids == ["q1"]  # only test judgments: read, and said
    assert "has no qrels/dev.tsv: judging by" in caplog.text and "not held out" in caplog.text
    write(tmp_path / "qrels" / "dev.tsv", "query-id\tcorpus-id\tscore\nq2\td2\t1\n")
    assert load_held_out(str(tmp_path), "dev").query_ids == ["q2"]
    assert load_held_out(str(tmp_path), "test").query_ids == ["q1"]
    (tmp_path / "qrels" / "test.tsv").unlink()  # MS MARCO's layout
    assert beir_qrels(tmp_path, "test") == tmp_path / "qrels" / "dev.tsv"
    (tmp_path / "qrels" / "dev.tsv").unlink()
    with pytest.raises(ValueError, match=r"qrels/dev.tsv does not exist"):
        load_held_out(str(tmp_path), "dev")


def test_a_graded_set_is_written_and_read_back_with_its_grades(tmp_path):
    graded = RetrievalSet(["q1"], ["cat"], ["d1", "d2", "d3"], ["a cat", "a kitten", "dog"],
                          {"q1": {"d1": 2.0, "d2": 1.0}})
    write_retrieval_set(tmp_path, graded)
    assert "q1\td1\t2\n" in (tmp_path / "qrels.tsv").read_text()
    assert read_retrieval_set(tmp_path / "queries.jsonl", tmp_path / "corpus.jsonl", tmp_path / "qrels.tsv") == graded


def test_sbert_reads_a_beir_folder_in_beirs_own_layout(tmp_path):
    """sbert evaluate --data and data.dev read only qrels.tsv; adapt --eval and index weight --tune took BEIR's
    qrels/test.tsv too (the repository's own python-faq set is laid out so)."""
    from bertforge.tasks.retrieval.recipe import load_held_out

    write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "cat"}\n')
    write(tmp_path / "corpus.jsonl", '{"_id": "d1", "text": "a cat"}\n{"_id": "d2", "text": "dog"}\n')
    (tmp_path / "qrels").mkdir()
    write(tmp_path / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert load_held_out(str(tmp_path)).relevant == {"q1": {"d1": 1.0}}
