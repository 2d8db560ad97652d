"""Task heads on top of BertModel, with Hugging Face's class and parameter names.

Each head owns a `BertModel` called `bert` (so checkpoint keys read `bert.encoder...`)
and adds a small module; each computes its loss when labels are given, ignoring -100.
Every head's forward takes `packing` (see `BertModel.forward`); the MLM heads also take
`masked_positions`, the flat positions of the labelled tokens, found on the host.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import BertPreTrainedModel
from ..engine.unpadding import Packing
from .config import BertConfig
from .model import BertModel, activation
from .outputs import ClassifierOutput, EncoderOutput, PreTrainingOutput, QuestionAnsweringOutput

IGNORE_INDEX = -100
CPU_VOCAB_SLICE = 2048  # words per slice of the masked-only MLM projection on CPU (see `masked_lm`)


class PredictionHeadTransform(nn.Module):
    """dense -> GELU -> LayerNorm, applied before the vocabulary projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


def tied_decoder(config: BertConfig) -> tuple[str, ...]:
    """The MLM decoder's weight, where it is the word-embedding matrix: neither read nor saved under its own name."""
    return ("cls.predictions.decoder.weight",) if config.ties_word_embeddings else ()


class LMPredictionHead(nn.Module):
    """Masked-token scores over the vocabulary; the decoder is the word-embedding matrix (tied), or its own weights
    where the config says tie_word_embeddings false (`BertConfig.ties_word_embeddings`)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.ties_word_embeddings:
            self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor, vocab_slice: int | None = None) -> Tensor:
        """(..., hidden) -> (..., vocab) scores; vocab_slice: project onto that many words at a time."""
        transformed = self.transform(hidden_states)
        if vocab_slice is None:
            # The bias goes into the projection: a separate add over (tokens, vocab) costs ~0.6 s a mini step.
            return F.linear(transformed, self.decoder.weight, self.bias)  # (..., vocab)
        slices = zip(self.decoder.weight.split(vocab_slice), self.bias.split(vocab_slice))
        return torch.cat([F.linear(transformed, weight, bias) for weight, bias in slices], dim=-1)


class PreTrainingHeads(nn.Module):
    """Holds `predictions` (MLM) and/or `seq_relationship` (NSP) under the checkpoint name `cls`."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding | None, next_sentence: bool):
        super().__init__()
        if word_embeddings is not None:
            self.predictions = LMPredictionHead(config, word_embeddings)
        if next_sentence:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


def masked_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def masked_positions_from(labels: Tensor) -> Tensor:
    """(batch, seq) MLM labels -> (num_predictions,) flat positions of the labelled tokens, row-major.

    Collators call it on the host: inside the forward pass it would read the labels back from the device.
    """
    return (labels != IGNORE_INDEX).flatten().nonzero().squeeze(1)


def padded_masked_positions(labels: Tensor, count: int) -> Tensor:
    """`masked_positions_from(labels)` padded to `count` with the position of an unlabelled token (the loss and
    the accuracy skip it): one shape for every batch, which a step replayed from a CUDA graph needs."""
    positions = masked_positions_from(labels)
    if len(positions) >= count:
        return positions
    unlabelled = (labels == IGNORE_INDEX).flatten().nonzero()
    filler = int(unlabelled[0]) if len(unlabelled) else 0
    return torch.cat([positions, positions.new_full((count - len(positions),), filler)])


def masked_lm(head: LMPredictionHead, hidden_states: Tensor, labels: Tensor | None, masked_only: bool,
              masked_positions: Tensor | None = None):
    """MLM logits and loss; with masked_only, the head runs on the masked positions alone.

    The full head scores every token against the whole vocabulary, though only ~15% of
    positions have a label: gathering them first gives the same loss for a fraction of the
    FLOPs. Logits are then (num_predictions, vocab) in row-major order of the masked positions,
    which are `masked_positions` when the collator gave them, else found from the labels.
    """
    if masked_only and labels is not None:
        if masked_positions is None:
            masked_positions = masked_positions_from(labels)
        # On CPU, scoring a few hundred rows against 30k words runs ~25% faster in 2048-word slices,
        # whose outputs stay in cache, than as one GEMM (~5% of a BERT-mini pretraining step).
        vocab_slice = CPU_VOCAB_SLICE if hidden_states.device.type == "cpu" else None
        selected = hidden_states.flatten(0, 1).index_select(0, masked_positions)  # (num_predictions, hidden)
        logits = head(selected, vocab_slice)  # (num_predictions, vocab)
        return logits, masked_lm_loss(logits, labels.flatten().index_select(0, masked_positions))
    logits = head(hidden_states)  # (batch, seq, vocab)
    return logits, masked_lm_loss(logits, labels) if labels is not None else None


def encode(bert: BertModel, input_ids: Tensor, attention_mask, token_type_ids, position_ids,
           output_hidden_states: bool, output_attentions: bool, packing: Packing | None) -> EncoderOutput:
    return bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                output_hidden_states=output_hidden_states, output_attentions=output_attentions, packing=packing)


class BertForPreTraining(BertPreTrainedModel):
    """BERT's own objective: masked LM + next sentence prediction; loss is their sum."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = PreTrainingHeads(config, self.bert.embeddings.word_embeddings, next_sentence=True)
        self.tied_keys = tied_decoder(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                next_sentence_label=None, output_hidden_states=False, output_attentions=False,
                masked_only: bool = False, packing=None, masked_positions=None) -> PreTrainingOutput:
        """labels: (batch, seq) token ids at masked positions, -100 elsewhere; next_sentence_label: (batch,) 0=IsNext.

        The loss is MLM + NSP, or MLM alone when next_sentence_label is None (RoBERTa-style).
        masked_only: run the MLM head on labelled positions only (see `masked_lm`), which are
        masked_positions (num_predictions,) when given. packing: see `BertModel.forward`.
        """
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, position_ids,
                     output_hidden_states, output_attentions, packing)
        prediction_logits, mlm_loss = masked_lm(self.cls.predictions, out.last_hidden_state, labels, masked_only,
                                                masked_positions)
        seq_relationship_logits = self.cls.seq_relationship(out.pooler_output)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_relationship_logits.float(), next_sentence_label.reshape(-1))
        loss = mlm_loss + nsp_loss if mlm_loss is not None and nsp_loss is not None else mlm_loss
        return PreTrainingOutput(loss, prediction_logits, seq_relationship_logits, out.hidden_states, out.attentions,
                                 mlm_loss=mlm_loss, nsp_loss=nsp_loss)


class BertForMaskedLM(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)  # MLM never uses [CLS] pooling
        self.cls = PreTrainingHeads(config, self.bert.embeddings.word_embeddings, next_sentence=False)
        self.tied_keys = tied_decoder(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False, masked_only: bool = False, packing=None,
                masked_positions=None) -> ClassifierOutput:
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, position_ids,
                     output_hidden_states, output_attentions, packing)
        logits, loss = masked_lm(self.cls.predictions, out.last_hidden_state, labels, masked_only, masked_positions)
        return ClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = PreTrainingHeads(config, None, next_sentence=True)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False, packing=None) -> ClassifierOutput:
        """labels: (batch,) 0 = B follows A (IsNext), 1 = B is random (NotNext)."""
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, position_ids,
                     output_hidden_states, output_attentions, packing)
        logits = self.cls.seq_relationship(out.pooler_output)  # (batch, 2)
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None
        return ClassifierOutput(loss, logits, out.hidden_states, out.attentions)


def classifier_layers(config: BertConfig) -> tuple[nn.Dropout, nn.Linear]:
    """The dropout and the linear layer (hidden -> num_labels) of a classifier head, under HF's names."""
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p), nn.Linear(config.hidden_size, config.num_labels)


def sequence_classification_loss(logits: Tensor, labels: Tensor, config: BertConfig) -> Tensor:
    """Loss by problem type: regression (MSE), single-label (CE) or multi-label (BCE).

    When config.problem_type is unset it is inferred as transformers does: one label
    means regression, integer labels single-label, float labels multi-label.
    """
    problem_type = config.problem_type
    if problem_type is None:
        if config.num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.float().reshape(logits.shape[:-1]))
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, config.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX)
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def token_classification_loss(logits: Tensor, labels: Tensor, config: BertConfig) -> Tensor:
    """Cross-entropy over every token whose label is not IGNORE_INDEX (padding, continuation pieces)."""
    return F.cross_entropy(logits.float().view(-1, config.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX)


def classifier_forward(features: str, loss):
    """The forward of a classifier head: its `dropout` and `classifier` on the encoder's `features`.

    features: pooler_output (batch, hidden) or last_hidden_state (batch, seq, hidden); loss(logits, labels,
    config) when labels are given. Written once: the sequence and token heads differ only in these two.
    """
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False, packing=None) -> ClassifierOutput:
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, position_ids,
                     output_hidden_states, output_attentions, packing)
        logits = self.classifier(self.dropout(getattr(out, features)))
        return ClassifierOutput(None if labels is None else loss(logits, labels, self.config), logits,
                                out.hidden_states, out.attentions)
    return forward


class BertForSequenceClassification(BertPreTrainedModel):
    """A linear classifier on the pooled [CLS] vector: single or pair input."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout, self.classifier = classifier_layers(config)
        self.init_weights()

    forward = classifier_forward("pooler_output", sequence_classification_loss)  # logits (batch, num_labels)


class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (NER): a linear layer on every final hidden state."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout, self.classifier = classifier_layers(config)
        self.init_weights()

    forward = classifier_forward("last_hidden_state", token_classification_loss)  # logits (batch, seq, num_labels)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA: a start and an end score for every token."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_hidden_states=False,
                output_attentions=False, packing=None) -> QuestionAnsweringOutput:
        """start_positions/end_positions: (batch,) token indices of the answer span."""
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, position_ids,
                     output_hidden_states, output_attentions, packing)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # (batch, seq) each
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions outside the window (answer truncated away) are clamped to seq_len and ignored.
            seq = start_logits.size(1)
            start = start_positions.reshape(-1).clamp(0, seq)
            end = end_positions.reshape(-1).clamp(0, seq)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=seq)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=seq)) / 2
        return QuestionAnsweringOutput(loss, start_logits.contiguous(), end_logits.contiguous(),
                                       out.hidden_states, out.attentions)
