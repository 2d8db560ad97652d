"""Word senses: batched occurrence vectors equal word_vector's, k chosen by silhouette, the plot, the CLI."""
import importlib.util

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score

from bertforge.cli.parser import main
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.embeddings.embed import Embedder
from bertforge.embeddings.senses import (cluster_senses, find_occurrences, occurrence_vectors, plot_senses,
                                         word_senses)


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    return Embedder.from_pretrained(minilm_dir, batch_size=8)


@pytest.fixture(scope="module")
def party_sentences(data_dir):
    """Sentences of Persuasion that hold "party" (a gathering, or a side in an affair)."""
    return [s for document in read_documents(data_dir / "austen" / "persuasion.txt") for s in document
            if " party" in s.lower()]


def test_occurrences_are_whole_words_with_their_spans():
    found = find_occurrences(["A Bank holiday; the bank's banking.", "No match: embankment."], "bank")
    assert [(o.sentence[o.start:o.end], o.start) for o in found] == [("Bank", 2), ("bank", 20)]
    assert found[1].context(width=4) == "...the [bank]'s b..."
    with pytest.raises(ValueError, match="non-empty str"):
        find_occurrences(["text"], "  ")


def test_batched_vectors_equal_word_vector_one_sentence_at_a_time(embedder, party_sentences):
    occurrences = find_occurrences(party_sentences[:12], "party")
    vectors, kept = occurrence_vectors(embedder, occurrences)
    assert kept == list(range(len(occurrences))) and vectors.shape == (len(occurrences), 384)
    for vector, occurrence in zip(vectors, occurrences):
        nth = sum(1 for o in occurrences if o.sentence == occurrence.sentence and o.start < occurrence.start)
        np.testing.assert_allclose(vector, embedder.word_vector(occurrence.sentence, "party", nth), atol=2e-5)


def test_a_folders_prompt_is_read_before_each_sentence_as_word_vector_reads_it(minilm_dir, party_sentences):
    """Under a default prompt ("query: ") word_vector read the sentence after it and senses without it: the same
    occurrence had two vectors (cosine 0.983)."""
    prompted = Embedder.from_pretrained(minilm_dir, batch_size=4, prompt="query: ")
    occurrences = find_occurrences(party_sentences[:6], "party")
    vectors, kept = occurrence_vectors(prompted, occurrences)
    expected = [prompted.span_vectors(occurrences[i].sentence, [(occurrences[i].start, occurrences[i].end)])[0]
                for i in kept]
    np.testing.assert_allclose(vectors, np.stack(expected), atol=2e-5)


def test_occurrences_past_max_length_are_left_out(minilm_dir):
    short = Embedder.from_pretrained(minilm_dir, max_length=8)
    occurrences = find_occurrences(["the party was long ago", "one two three four five six seven party"], "party")
    vectors, kept = occurrence_vectors(short, occurrences)
    assert kept == [0] and vectors.shape == (1, 384)


def test_number_of_senses_is_the_best_silhouette(embedder):
    """Two planted senses of "bank" (river / money) in real-sounding sentences come apart as k=2."""
    river = [f"They sat on the grassy bank of the river {w}." for w in ("Avon", "Thames", "Severn", "Wye", "Test")]
    money = [f"She paid the cheque into the bank in {w}." for w in ("Bath", "London", "Bristol", "Leeds", "York")]
    senses = word_senses(embedder, river + money, "bank", max_senses=4)
    assert senses.num_senses == 2 and sorted(senses.silhouettes) == [2, 3, 4]
    assert senses.silhouettes[2] == max(senses.silhouettes.values())
    assert len(set(senses.labels[:5])) == 1 and len(set(senses.labels[5:])) == 1 and senses.labels[0] != senses.labels[5]
    # The silhouettes are scikit-learn's for k-means with the same seed.
    labels = KMeans(n_clusters=3, n_init=10, random_state=0).fit_predict(senses.vectors)
    assert senses.silhouettes[3] == pytest.approx(silhouette_score(senses.vectors, labels, metric="cosine"))
    assert senses.points["PCA"].shape == (10, 2)


def test_too_few_occurrences_is_a_clear_error(embedder):
    with pytest.raises(ValueError, match="occurs 2 time"):
        word_senses(embedder, ["the bank", "a bank", "no match"], "bank")
    with pytest.raises(ValueError, match="max_senses"):
        cluster_senses(np.eye(5, dtype=np.float32), max_senses=1)


def test_a_sample_too_small_for_senses_is_a_usage_error(embedder, party_sentences):
    """--max-occurrences 3 always failed, saying the word occurs 3 times (it occurs 21 times: 3 was the sample)."""
    with pytest.raises(ValueError, match="--max-occurrences 3: senses need at least 4 occurrences"):
        word_senses(embedder, party_sentences, "party", max_occurrences=3)


def test_largest_sense_is_numbered_first():
    rng = np.random.default_rng(0)
    small, large = rng.normal([5, 0, 0], 0.1, (4, 3)), rng.normal([0, 5, 0], 0.1, (12, 3))
    labels, _ = cluster_senses(np.vstack([small, large]).astype(np.float32), max_senses=2)
    assert labels.tolist() == [1] * 4 + [0] * 12


def test_senses_cli_prints_senses_and_writes_the_plot(tmp_path, capsys, party_sentences):
    corpus = tmp_path / "party.txt"
    corpus.write_text("\n\n".join(party_sentences[:30]) + "\n", encoding="utf-8")
    code = main(["senses", "party", str(corpus), "--model", "minilm", "--plot", str(tmp_path / "party.png"),
                 "--max-senses", "3", "--examples", "2", "--no-umap"])
    out = capsys.readouterr().out
    assert code == 0
    assert "'party':" in out and "silhouette by number of senses: 2:" in out and "sense 1 (" in out
    assert (tmp_path / "party.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code = main(["senses", "zeppelin", str(corpus), "--no-umap"])
    assert code == 1 and "occurs 0 time(s)" in capsys.readouterr().err  # bad data: exit 1


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("umap") is None, reason="umap-learn is not installed")
def test_umap_panel_when_umap_is_installed(embedder, party_sentences, tmp_path):
    senses = word_senses(embedder, party_sentences[:25], "party", max_senses=3, umap=True)
    assert set(senses.points) == {"PCA", "UMAP"} and senses.points["UMAP"].shape == (len(senses.occurrences), 2)
    assert plot_senses(senses, tmp_path / "p.png").stat().st_size > 10_000


def test_a_plot_of_one_panel_fills_its_figure(embedder, party_sentences, tmp_path):
    """Without umap-learn (the default install) the PCA panel was squeezed to ~40% of a 6.5-inch figure: the layout
    made room for the context lines under it, which are wider than one panel."""
    from matplotlib.image import imread

    senses = word_senses(embedder, party_sentences[:25], "party", max_senses=3, umap=False)
    image = imread(plot_senses(senses, tmp_path / "one.png"))
    upper = image[: int(image.shape[0] * 0.8), :, :3]  # the panel and its title, above the context lines
    drawn_columns = (upper < 0.9).any(axis=(0, 2)).mean()
    assert drawn_columns > 0.9
