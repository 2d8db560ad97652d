"""Losses for sentence encoders, computed from sentence vectors (the encoder runs elsewhere).

- `multiple_negatives_ranking_loss` (MNRL, InfoNCE with in-batch negatives): each anchor
  must score its own positive above every other positive in the batch and every hard
  negative; optionally symmetric (each positive must also pick its own anchor).
- `cosent_loss` (CoSENT, Su 2022): for scored pairs, every pair with a higher gold score
  must get a higher cosine than every pair with a lower one; only the order matters.
- `cosine_similarity_loss`: the mean squared error between cosine and gold score.
- `score_distillation_loss`: the KL divergence from a teacher's in-batch score distribution to the
  student's (each anchor's softmax over the batch's positives), so training on new pairs keeps
  the ranking a trusted model gives the batch (Hinton et al. 2015 on retrieval scores).
- `matryoshka`: any of these summed over leading slices of the vectors (Kusupati et al. 2022),
  so the first 64 or 128 dimensions work on their own.

The values equal sentence-transformers' MultipleNegativesRankingLoss (directions
query_to_doc [+ doc_to_query, per_direction]), CoSENTLoss, CosineSimilarityLoss and
MatryoshkaLoss on the same vectors (tests/test_retrieval_losses.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

LOSSES = ("mnrl", "cosent", "cosine")


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """(n, dim), (m, dim) -> (n, m) cosine similarities."""
    return F.normalize(a, p=2, dim=-1) @ F.normalize(b, p=2, dim=-1).T


def multiple_negatives_ranking_loss(anchors: Tensor, positives: Tensor, negatives: Tensor | None = None, *,
                                    scale: float = 20.0, symmetric: bool = False) -> Tensor:
    """In-batch negatives: cross-entropy of each anchor over all candidates, its own positive the answer.

    anchors, positives: (batch, dim); negatives: (batch * k, dim) hard negatives (any order: they
    are candidates for every anchor), or None. scale multiplies the cosines (1 / temperature).
    symmetric adds, averaged with it, the loss of each positive choosing its anchor among all
    anchors (the per-direction symmetric InfoNCE of Günther et al. 2024).
    """
    candidates = positives if negatives is None else torch.cat([positives, negatives])
    scores = cosine_matrix(anchors, candidates) * scale  # (batch, batch [+ negatives])
    answers = torch.arange(len(anchors), device=anchors.device)
    loss = F.cross_entropy(scores, answers)
    if not symmetric:
        return loss
    backward = cosine_matrix(positives, anchors) * scale  # (batch, batch): each positive picks an anchor
    # Both directions share the positive's logit, so averaging the two cross-entropies is
    # averaging their log-partitions: what sentence-transformers' per_direction mode computes.
    return (loss + F.cross_entropy(backward, answers)) / 2


def score_distillation_loss(anchors: Tensor, positives: Tensor, teacher_anchors: Tensor, teacher_positives: Tensor,
                            *, scale: float = 20.0, symmetric: bool = False, documents: float = 0.0,
                            lexical: Tensor | None = None, lexical_share: float = 0.0) -> Tensor:
    """KL(teacher || student) of each anchor's softmax over the batch's positives (both directions if symmetric).

    anchors, positives: (batch, dim) student vectors; teacher_*: the teacher's vectors of the same texts
    (no gradient). Both score matrices are cosines times `scale`, so equal rankings at equal margins cost 0.
    documents: the weight of a second KL, of each positive's softmax over the other positives (itself left
    out), so the teacher's document-to-document similarities are kept too: ICT moves sentences toward
    their passages, and a search with a whole review for similar ones needs the passages' own geometry.
    lexical: (batch, batch) lexical scores of the same anchors and positives (BM25); the teacher's anchor-to-positive
    scores are then its cosines re-ranked by them, at lexical_share (`fused_rows`): the ranking a hybrid search gives.
    """
    student = cosine_matrix(anchors, positives).float() * scale
    teacher = cosine_matrix(teacher_anchors, teacher_positives).float()
    backward = teacher.T
    if lexical is not None and lexical_share:
        teacher, backward = (fused_rows(teacher, lexical.float(), lexical_share),
                             fused_rows(backward, lexical.float().T, lexical_share))
    loss = kl_divergence(student, teacher * scale)
    loss = (loss + kl_divergence(student.T, backward * scale)) / 2 if symmetric else loss
    if not documents or len(positives) < 3:  # with two documents each has one other: nothing to rank
        return loss
    return loss + documents * kl_divergence(off_diagonal(cosine_matrix(positives, positives).float() * scale),
                                            off_diagonal(cosine_matrix(teacher_positives, teacher_positives).float()
                                                         * scale))


def fused_rows(cosines: Tensor, lexical: Tensor, share: float) -> Tensor:
    """Each row of cosines re-ranked by a lexical scorer: `hybrid.fuse`'s rule (both rows min-max normalised and
    mixed, `share` the lexical one's weight, 1 - share the dense weight), here on tensors and mapped back onto the
    row's own cosine range, so the softmax over it is as sharp as the dense teacher's (tested equal to `fuse`)."""
    low, high = cosines.min(dim=-1, keepdim=True).values, cosines.max(dim=-1, keepdim=True).values
    mixed = (1 - share) * min_max(cosines) + share * min_max(lexical)
    return low + (high - low) * mixed


def min_max(scores: Tensor) -> Tensor:
    """Each row scaled onto [0, 1] (a row of equal scores: all 0)."""
    low, high = scores.min(dim=-1, keepdim=True).values, scores.max(dim=-1, keepdim=True).values
    return (scores - low) / (high - low).clamp(min=1e-12)


def kl_divergence(student: Tensor, teacher: Tensor) -> Tensor:
    """KL(softmax(teacher) || softmax(student)) per row, averaged over rows: scores (rows, candidates)."""
    return F.kl_div(F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1), log_target=True,
                    reduction="batchmean")


def off_diagonal(square: Tensor) -> Tensor:
    """(n, n) -> (n, n - 1): each row without its own column (a text's similarity to itself ranks nothing)."""
    n = square.shape[0]
    return square.flatten()[1:].view(n - 1, n + 1)[:, :-1].reshape(n, n - 1)


def cosent_loss(first: Tensor, second: Tensor, scores: Tensor, *, scale: float = 20.0) -> Tensor:
    """log(1 + sum over pairs (i, j) with score_i > score_j of exp(scale * (cos_j - cos_i))).

    first, second: (batch, dim), the two sides of each pair; scores: (batch,) gold similarity.
    """
    cosines = F.cosine_similarity(first, second, dim=-1).float() * scale  # (batch,)
    differences = cosines[None, :] - cosines[:, None]  # [i, j] = cos_j - cos_i
    ordered = scores[:, None] > scores[None, :]  # pairs where i should score above j
    terms = differences[ordered]
    # A zero logit is the "1 +": the loss is 0 when every ordered pair is far apart, as it should.
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def cosine_similarity_loss(first: Tensor, second: Tensor, scores: Tensor) -> Tensor:
    """Mean squared error between cos(first, second) and the gold scores (batch,)."""
    return F.mse_loss(F.cosine_similarity(first, second, dim=-1).float(), scores.float())


def matryoshka(loss: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float] | None = None
               ) -> Callable[..., Tensor]:
    """The loss summed over leading slices [:d] of every vector argument, one term per d in dims.

    The returned function takes the same arguments as `loss`; tensor arguments with a vector
    last axis are cut, anything else (gold scores) is passed through. Slices are re-normalised
    implicitly: every loss here compares cosines.
    """
    weights = list(weights) if weights is not None else [1.0] * len(dims)
    if len(weights) != len(dims):
        raise ValueError(f"matryoshka weights {weights} must be as many as its dims {list(dims)}")

    def sliced(*vectors: Tensor | None, **options) -> Tensor:
        total = 0.0
        for dim, weight in zip(dims, weights):
            cut = [v[..., :dim] if v is not None and v.dim() == 2 else v for v in vectors]
            total = total + weight * loss(*cut, **options)
        return total

    return sliced
