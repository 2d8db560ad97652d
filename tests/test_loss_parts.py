"""BertForPreTraining returns its loss's parts, so statistics never compute the losses a second time."""
import torch
import torch.nn.functional as F

from bertforge import BertConfig, BertForPreTraining
from bertforge.models.heads import IGNORE_INDEX


def test_pretraining_output_carries_mlm_and_nsp_losses_that_sum_to_the_loss():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config).eval()
    input_ids = torch.randint(5, 99, (3, 7))
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, 2], labels[0, 5] = input_ids[:, 2], input_ids[0, 5]
    next_sentence = torch.tensor([0, 1, 0])
    for masked_only in (False, True):
        out = model(input_ids, labels=labels, next_sentence_label=next_sentence, masked_only=masked_only)
        full = model(input_ids)
        expected_mlm = F.cross_entropy(full.prediction_logits.reshape(-1, 99), labels.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        expected_nsp = F.cross_entropy(full.seq_relationship_logits, next_sentence)
        torch.testing.assert_close(out.mlm_loss, expected_mlm)
        torch.testing.assert_close(out.nsp_loss, expected_nsp)
        torch.testing.assert_close(out.loss, expected_mlm + expected_nsp)
        assert out.keys() == ["loss", "prediction_logits", "seq_relationship_logits"]  # HF's fields only
    mlm_only = model(input_ids, labels=labels)
    assert mlm_only.nsp_loss is None
    torch.testing.assert_close(mlm_only.loss, mlm_only.mlm_loss)
