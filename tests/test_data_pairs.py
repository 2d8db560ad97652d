"""Sentence pairs: google-research/bert's create_instances_from_document rules, checked instance by instance.

`check_plans` re-derives, from sentence lengths alone, what the original's loop must have done
for every instance (chunking, the put-back, B's span, truncation), so a wrong implementation
fails on the instance where it goes wrong. A line-by-line port of the original (python `random`)
serves as the statistical oracle.
"""
import json
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.tasks.pretraining import make_sentence_pairs, plan_sentence_pairs, prepare_corpus
from bertforge.tasks.pretraining.pairs import truncation
from bertforge.tokenization.tokenizer import BertTokenizer

CLS, SEP = 101, 102


class ListCorpus:
    """The corpus interface pairs.py uses, over documents given as lists of token-id lists."""
    cls_token_id, sep_token_id = CLS, SEP

    def __init__(self, documents):
        self.documents = documents

    @property
    def num_documents(self):
        return len(self.documents)

    def sentence_lengths(self, index):
        return np.array([len(sentence) for sentence in self.documents[index]], dtype=np.int64)

    def tokens(self, index, start=0, end=None):
        return np.array(sum(self.documents[index][start:end], []), dtype=np.int64)


def random_documents(sentence_lengths: list[list[int]], seed=0) -> ListCorpus:
    rng = np.random.default_rng(seed)
    return ListCorpus([[rng.integers(1000, 2000, size=n).tolist() for n in doc] for doc in sentence_lengths])


@pytest.fixture(scope="module")
def chapters(minilm_dir, data_dir, tmp_path_factory):
    """The first 30 chapters of Pride and Prejudice, one document each."""
    text = (data_dir / "austen" / "prideprejudice.txt").read_text(encoding="utf-8")
    parts = re.split(r"\nChapter \d+\n", text)[1:31]
    folder = tmp_path_factory.mktemp("chapters")
    (folder / "chapters.jsonl").write_text("".join(json.dumps({"text": part}) + "\n" for part in parts))
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    return prepare_corpus(folder / "chapters.jsonl", tokenizer, folder / "prepared", progress=False)


# ---------------------------------------------------------------- the oracle

def original_pairs(lengths_of_documents, document_index, max_seq_length, short_seq_prob, rng: random.Random):
    """create_instances_from_document of google-research/bert, line for line, on token counts only.

    Returns (length_a, length_b, is_random_next) after truncate_seq_pair, per instance.
    """
    document = lengths_of_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances, current_chunk, current_length, i = [], [], 0, 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += segment
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = rng.randint(1, len(current_chunk) - 1)
            tokens_a = sum(current_chunk[:a_end])
            if len(current_chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - tokens_a
                for _ in range(10):
                    random_document_index = rng.randint(0, len(lengths_of_documents) - 1)
                    if random_document_index != document_index:
                        break
                random_document = lengths_of_documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                tokens_b = 0
                for j in range(random_start, len(random_document)):
                    tokens_b += random_document[j]
                    if tokens_b >= target_b_length:
                        break
                i -= len(current_chunk) - a_end
            else:
                is_random_next = False
                tokens_b = sum(current_chunk[a_end:])
            tokens_a, tokens_b = original_truncation(tokens_a, tokens_b, max_num_tokens)
            instances.append((tokens_a, tokens_b, is_random_next))
            current_chunk, current_length = [], 0
        i += 1
    return instances


def original_truncation(length_a, length_b, max_num_tokens):
    """truncate_seq_pair's resulting lengths (which end loses a token does not change them)."""
    while length_a + length_b > max_num_tokens:
        if length_a > length_b:
            length_a -= 1
        else:
            length_b -= 1
    return length_a, length_b


def check_plans(corpus, document, plans, max_seq_length, target=None):
    """Assert that `plans` are what the original's loop can produce for `document`.

    With `target` (the document's target_seq_length), also check where chunks and B spans end.
    """
    lengths = corpus.sentence_lengths(document)
    ends = np.concatenate([[0], np.cumsum(lengths)])
    max_num_tokens = max_seq_length - 3
    next_start = 0
    for plan in plans:
        a, b = plan.a, plan.b
        assert (a.document, a.start) == (document, next_start) and a.end > a.start
        length_a = ends[a.end] - ends[a.start]
        if plan.is_random_next:
            assert b.document != document
            next_start = a.end  # the rest of the chunk is put back
            b_lengths = corpus.sentence_lengths(b.document)
            b_ends = np.concatenate([[0], np.cumsum(b_lengths)])
            length_b = b_ends[b.end] - b_ends[b.start]
            if target is not None:
                if length_a >= target:  # only a one-sentence chunk can reach the target with A alone
                    assert a.end - a.start == 1
                target_b = target - length_a  # B: whole sentences until target_b, or its document's end
                assert b_ends[b.end - 1] - b_ends[b.start] < target_b or b.end - b.start == 1
                assert length_b >= target_b or b.end == len(b_lengths)
        else:
            assert (b.document, b.start) == (document, a.end) and b.end > b.start
            next_start = b.end
            length_b = ends[b.end] - ends[b.start]
            if target is not None:  # the chunk stops at the first sentence that reaches the target
                assert ends[b.end] - ends[a.start] >= target or b.end == len(lengths)
                assert ends[b.end - 1] - ends[a.start] < target
        kept = original_truncation(length_a, length_b, max_num_tokens)
        assert (length_a - a.trim_front - a.trim_back, length_b - b.trim_front - b.trim_back) == kept
        assert min(a.trim_front, a.trim_back, b.trim_front, b.trim_back) >= 0
    assert next_start == len(lengths)  # every sentence went into some A or true-next B


def segment_tokens(corpus, segment):
    full = corpus.tokens(segment.document, segment.start, segment.end)
    return full[segment.trim_front:len(full) - segment.trim_back].tolist()


def check_layout(pair, corpus, max_seq_length):
    """[CLS] A [SEP] B [SEP] with the planned tokens; type ids 0 through the first [SEP], then 1."""
    a, b = segment_tokens(corpus, pair.plan.a), segment_tokens(corpus, pair.plan.b)
    assert len(a) >= 1 and len(b) >= 1 and len(pair.input_ids) <= max_seq_length
    assert pair.input_ids.dtype == np.int64 and pair.input_ids.tolist() == [CLS, *a, SEP, *b, SEP]
    assert pair.token_type_ids.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert pair.next_sentence_label == int(pair.plan.is_random_next)


# ---------------------------------------------------------------- real text

def test_isnext_is_half_of_the_chunks_that_could_go_either_way(chapters):
    rng = np.random.default_rng(1)
    max_seq_length, target = 128, 125
    is_next, forced = [], 0
    for _ in range(8):
        for document in range(chapters.num_documents):
            plans = plan_sentence_pairs(chapters, document, rng, max_seq_length, short_seq_prob=0.0)
            check_plans(chapters, document, plans, max_seq_length, target)
            lengths = chapters.sentence_lengths(document)
            for plan in plans:
                # A one-sentence chunk (the sentence alone reaches the target, or the document ends) is always NotNext.
                if plan.is_random_next and (lengths[plan.a.start] >= target or plan.a.start == len(lengths) - 1):
                    forced += 1
                else:
                    is_next.append(not plan.is_random_next)
    n = len(is_next)
    assert n > 4000 and forced < n / 20
    assert abs(np.mean(is_next) - 0.5) < 4 * np.sqrt(0.25 / n)


def test_built_pairs_hold_the_planned_tokens(chapters):
    pairs = make_sentence_pairs(chapters, 3, np.random.default_rng(0), max_seq_length=64)
    assert len(pairs) > 20 and {p.next_sentence_label for p in pairs} == {0, 1}
    for pair in pairs:
        check_layout(pair, chapters, 64)
    true_next = next(p for p in pairs if p.next_sentence_label == 0 and p.plan.a.trim_back == p.plan.b.trim_front == 0)
    # B really continues A: A then B is an unbroken run of the chapter's tokens.
    a, b = true_next.plan.a, true_next.plan.b
    run = chapters.tokens(3, a.start, b.end).tolist()
    assert segment_tokens(chapters, a) + segment_tokens(chapters, b) == run[a.trim_front:len(run) - b.trim_back]
    assert true_next.input_ids.tolist() == [CLS, *segment_tokens(chapters, a), SEP, *segment_tokens(chapters, b), SEP]


def test_statistics_match_the_original(chapters):
    """Our plans and the port of the original on the same documents: means agree within 5 standard errors.

    short_seq_prob=0: its draw is per document, so with it instances are not independent samples.
    """
    lengths = [chapters.sentence_lengths(d).tolist() for d in range(chapters.num_documents)]
    ours, original = [], []
    rng, python_rng = np.random.default_rng(5), random.Random(5)
    for _ in range(4):
        for document in range(len(lengths)):
            for plan in plan_sentence_pairs(chapters, document, rng, 128, short_seq_prob=0.0):
                a, b = plan.a, plan.b
                length_a = sum(lengths[document][a.start:a.end]) - a.trim_front - a.trim_back
                length_b = sum(lengths[b.document][b.start:b.end]) - b.trim_front - b.trim_back
                ours.append((length_a + length_b, plan.is_random_next, length_a))
            original.extend((la + lb, random_next, la)
                            for la, lb, random_next in original_pairs(lengths, document, 128, 0.0, python_rng))
    assert abs(len(ours) - len(original)) < 5 * np.sqrt(len(ours) + len(original))
    for column in (0, 1, 2):  # total length, NotNext, length of A
        x = np.array([row[column] for row in ours], dtype=float)
        y = np.array([row[column] for row in original], dtype=float)
        standard_error = np.sqrt(x.var() / len(x) + y.var() / len(y))
        assert abs(x.mean() - y.mean()) < 5 * standard_error, column


# ---------------------------------------------------------------- rules on synthetic documents

@settings(max_examples=60, deadline=None)
@given(documents=st.lists(st.lists(st.integers(1, 90), min_size=1, max_size=12), min_size=2, max_size=5),
       max_seq_length=st.integers(5, 70), short_seq_prob=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2 ** 16))
def test_property_pairs_fit_and_follow_the_rules(documents, max_seq_length, short_seq_prob, seed):
    corpus = random_documents(documents, seed)
    rng = np.random.default_rng(seed)
    for document in range(corpus.num_documents):
        pairs = make_sentence_pairs(corpus, document, rng, max_seq_length, short_seq_prob)
        check_plans(corpus, document, [pair.plan for pair in pairs], max_seq_length,
                    target=max_seq_length - 3 if short_seq_prob == 0 else None)
        for pair in pairs:
            check_layout(pair, corpus, max_seq_length)


@settings(max_examples=60, deadline=None)
@given(documents=st.lists(st.lists(st.integers(1, 90), min_size=1, max_size=12), min_size=1, max_size=3),
       max_seq_length=st.integers(5, 70), seed=st.integers(0, 2 ** 16))
def test_property_mlm_only_packs_whole_sentences_and_reads_every_token_once(documents, max_seq_length, seed):
    """A sentence longer than a sequence is read in consecutive windows (cut to one window at random ends, the
    rest of a text without full stops was never trained on: 4,433 of 9,866 tokens kept, group_texts keeps all)."""
    corpus = random_documents(documents, seed)
    for document in range(corpus.num_documents):
        pairs = make_sentence_pairs(corpus, document, np.random.default_rng(seed), max_seq_length,
                                    short_seq_prob=0.0, nsp=False)
        lengths, read = corpus.sentence_lengths(document), []
        for pair in pairs:
            a = pair.plan.a
            assert pair.plan.b is None and pair.next_sentence_label is None and len(pair.input_ids) <= max_seq_length
            assert pair.input_ids[0] == CLS and pair.input_ids[-1] == SEP and not pair.token_type_ids.any()
            full = corpus.tokens(document, a.start, a.end)
            assert pair.input_ids[1:-1].tolist() == full[a.trim_front:len(full) - a.trim_back].tolist()
            read.extend(pair.input_ids[1:-1].tolist())
            packed = lengths[a.start:a.end].sum()
            if a.end - a.start > 1 or packed <= max_seq_length - 2:
                assert a.trim_front == a.trim_back == 0 and packed <= max_seq_length - 2  # whole sentences
            if a.end < len(lengths) and not a.trim_front and not a.trim_back:  # the next would not have fitted
                assert packed + lengths[a.end] > max_seq_length - 2
        assert read == corpus.tokens(document).tolist()  # every token once, in order


def longest_instance(corpus, document, rng, short_seq_prob):
    """Tokens of A + B in the document's longest instance: its target length, to within a sentence."""
    pairs = make_sentence_pairs(corpus, document, rng, max_seq_length=128, short_seq_prob=short_seq_prob)
    return max(len(pair.input_ids) for pair in pairs) - 3


def test_short_seq_prob_shortens_a_tenth_of_the_documents():
    # Documents of 60 ten-token sentences. A document that drew a short target t = randint(2, 125)
    # has no instance longer than 10 * ceil(t / 10) (20 when t <= 10: one sentence and a one-sentence
    # random B); an unshortened one has instances of 125, the most that fits.
    corpus = random_documents([[10] * 60] * 300)
    rng = np.random.default_rng(7)
    short = [longest_instance(corpus, d, rng, 0.1) < 125 for d in range(corpus.num_documents)]
    expected = 0.1 * 119 / 124  # a short target shows when t <= 120
    assert abs(np.mean(short) - expected) < 4 * np.sqrt(expected * (1 - expected) / len(short))
    longest = np.array([longest_instance(corpus, d, rng, 1.0) for d in range(corpus.num_documents)])
    targets = np.arange(2, 126)
    predicted = np.minimum(125, np.maximum(20, 10 * np.ceil(targets / 10)))  # for each t, equally likely
    assert abs(longest.mean() - predicted.mean()) < 4 * predicted.std() / np.sqrt(len(longest))


def test_truncation_cuts_the_longer_side_from_random_ends():
    rng = np.random.default_rng(0)
    for length_a, length_b, max_num_tokens in [(10, 3, 8), (3, 10, 8), (7, 7, 9), (50, 2, 5), (4, 4, 8), (1, 1, 2)]:
        (a_front, a_back), (b_front, b_back) = truncation(length_a, length_b, max_num_tokens, rng)
        kept = (length_a - a_front - a_back, length_b - b_front - b_back)
        assert kept == original_truncation(length_a, length_b, max_num_tokens)
    fronts = [truncation(200, 0, 100, rng)[0][0] for _ in range(200)]  # binomial(100, 1/2) each
    assert abs(np.mean(fronts) - 50) < 4 * np.sqrt(25 / 200)


def test_same_rng_seed_same_pairs(chapters):
    first = make_sentence_pairs(chapters, 2, np.random.default_rng(3))
    second = make_sentence_pairs(chapters, 2, np.random.default_rng(3))
    assert [p.plan for p in first] == [p.plan for p in second]
    assert [p.plan for p in make_sentence_pairs(chapters, 2, np.random.default_rng(4))] != [p.plan for p in first]


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("max_seq_length", [4, 0, 4.5, True])
def test_max_seq_length_too_small(max_seq_length):
    with pytest.raises(ValueError, match="max_seq_length must be (at least 5|an integer), got "):
        make_sentence_pairs(random_documents([[3], [4]]), 0, np.random.default_rng(0), max_seq_length)


def test_nsp_needs_two_documents():
    with pytest.raises(ValueError, match="at least 2 documents"):
        make_sentence_pairs(random_documents([[3, 4]]), 0, np.random.default_rng(0))
    assert make_sentence_pairs(random_documents([[3, 4]]), 0, np.random.default_rng(0), nsp=False)


def test_bad_short_seq_prob():
    with pytest.raises(ValueError, match="short_seq_prob must be at most 1, got 1.5"):
        make_sentence_pairs(random_documents([[3], [4]]), 0, np.random.default_rng(0), short_seq_prob=1.5)
