"""Retrieval sets built from real text no one wrote for this project, with their splits as id lists.

Three sets (the texts stay in the shared data folder; `data/retrieval/<name>.json` holds the
ids, so a split is reviewed and versioned without copying anyone's text):
- drug-reviews: a patient's review is the query; relevant are the other reviews of the same
  drug for the same condition. Split by (drug, condition) group, so test groups are unseen.
  Training triplets take as hard negative a review of the same condition and another drug;
  scored pairs grade 2 (same drug and condition), 1 (same condition), 0 (other condition).
- austen: a sentence of a novel is the query; relevant is the sentence that follows it in the
  same paragraph. Split by novel: train on four, dev on Northanger Abbey, test on Persuasion.
- tweets: a retweet ("RT @user: ...") is the query; relevant is the original tweet with the
  same text (URLs aside), where the data has it; distractors are other tweets. Split by text.

`build_set(name, data_dir)` draws the ids (seeded); `prepare_set` writes the files that
`sbert train` and `sbert evaluate` read: train.jsonl (anchor, positive[, negative]),
train-scored.jsonl and {dev,test}-scored.jsonl (sentence1, sentence2, score) where the set has
grades, and {dev,test}/ in BEIR layout (queries.jsonl, corpus.jsonl, qrels.tsv).
"""
from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np

from ...atomic import replaced_file
from ...errors import UsageError
from ...input_files import open_table
from ...resources import demo_data
from ..pretraining.corpus import read_documents
from .reader import RetrievalSet, write_retrieval_set

SETS = ("drug-reviews", "austen", "tweets")
# The committed split ids: data/retrieval/ at the repository root (an editable install, as `make install` does).
SPLITS_FOLDER = Path(__file__).resolve().parents[3] / "data" / "retrieval"
SEED = 0
AUSTEN_NOVELS = {"train": ["emma", "mansfieldpark", "prideprejudice", "sensesensibility"],
                 "dev": ["northangerabbey"], "test": ["persuasion"]}
MIN_WORDS = 5  # Austen: "Oh!" or "Yes." has no next sentence anyone could find
AUSTEN_TRAIN_PAIRS, AUSTEN_QUERIES = {"train": 6000}, {"dev": 300, "test": 1000}
TWEET_DISTRACTORS = {"dev": 2000, "test": 8000}
RETWEET = re.compile(r"^RT @\w+:?\s*")
URL = re.compile(r"https?://\S*")


def check_set_name(name: str) -> None:
    """Raise UsageError (a command-line mistake) for a name that is not one of SETS."""
    if name not in SETS:
        raise UsageError(f"unknown retrieval set {name!r}; use one of {', '.join(SETS)}")


# ---------------------------------------------------------------- texts by id

def source_texts(name: str, data_dir: Path) -> dict[str, str]:
    """Every text a set may use, by its id, read from the shared data folder."""
    check_set_name(name)
    if name == "drug-reviews":
        return {row_id: text for row_id, text, _, _ in drug_review_rows(data_dir)}
    if name == "austen":
        return {sentence_id: text for sentence_id, text, _ in austen_sentences(data_dir)}
    return dict(tweet_rows(data_dir))


def drug_review_rows(data_dir: Path) -> list[tuple[str, str, str, str]]:
    """(id, review, drug, condition) of train.tsv then test.tsv; HTML entities and quoting undone."""
    rows = []
    for split in ("train", "test"):
        path = data_file(data_dir, f"drug-reviews/{split}.tsv")
        for row in csv_records(path, ["review", "drugName", "condition", ""]):
            review = html.unescape(row["review"]).strip().strip('"').strip()
            rows.append((f"review-{row['']}", review, row["drugName"].strip(), row["condition"].strip()))
    return rows


def austen_sentences(data_dir: Path) -> list[tuple[str, str, str]]:
    """(id "novel:paragraph:sentence", text, novel) for every sentence of the six novels, in order."""
    sentences = []
    for novel in (novel for names in AUSTEN_NOVELS.values() for novel in names):
        path = data_file(data_dir, f"austen/{novel}.txt")
        for paragraph, document in enumerate(read_documents(path, document_boundary="blank_line")):
            sentences.extend((f"{novel}:{paragraph}:{index}", text, novel) for index, text in enumerate(document))
    return sentences


def tweet_rows(data_dir: Path) -> list[tuple[str, str]]:
    path = data_file(data_dir, "tweets-sentiment/tweets.csv")
    return [(f"tweet-{index}", row["text"]) for index, row in enumerate(csv_records(path, ["text"]))]


def csv_records(path: Path, columns: list[str]) -> Iterator[dict[str, str]]:
    """The rows of a demo data CSV/TSV as dicts; ValueError naming the file when its header lacks one of
    `columns` or a row is cut short (another file, or a damaged copy, under the expected name)."""
    fix = "pass the shared data folder with --data (or fetch it again with `python scripts/fetch_data.py`)"
    with open_table(path) as reader:  # data_file may have found the .gz copy
        found = next(reader, [])
        missing = [column for column in columns if column not in found]
        if missing:
            raise ValueError(f"{path} has no column {missing[0]!r} (found {found}): it is not the file this set "
                             f"is drawn from; {fix}")
        for row in reader:
            if not row:  # a blank line
                continue
            if len(row) < len(found):
                raise ValueError(f"{path}:{reader.line_num}: the row has fewer fields than the header; {fix}")
            yield dict(zip(found, row))


def data_file(data_dir: Path | None, relative: str) -> Path:
    """A demo data file: under data_dir when given (plain or .gz), else where bertforge finds its demo data."""
    if data_dir is None:
        return demo_data(relative)  # $BERTFORGE_DATA, the project's data/, ../shared/data; says how to fetch it
    if not Path(data_dir).is_dir():
        what = "is a file" if Path(data_dir).exists() else "does not exist"
        raise ValueError(f"data folder {data_dir} {what}; pass the folder that holds {relative.split('/')[0]}/ "
                         "with --data (the project's data/ after `python scripts/fetch_data.py`, or ../shared/data)")
    for candidate in (Path(data_dir) / relative, Path(data_dir) / f"{relative}.gz"):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{Path(data_dir) / relative} not found: pass the data folder with --data (the project's data/ "
                     "after `python scripts/fetch_data.py`, or ../shared/data)")


# ---------------------------------------------------------------- drawing the ids

def build_set(name: str, data_dir: Path, seed: int = SEED) -> dict:
    """The set's splits as ids: {"train": [[anchor, positive(, negative)]...], "dev"/"test": {"queries", "corpus",
    "relevant"}, optional "train-scored"/"dev-scored"/"test-scored": [[id, id, score]...]}."""
    rng = np.random.default_rng(seed)
    check_set_name(name)
    builders = {"drug-reviews": build_drug_reviews, "austen": build_austen, "tweets": build_tweets}
    return {"name": name, "seed": seed, **builders[name](Path(data_dir), rng)}


def split_keys(keys: list, fractions: dict[str, float], rng: np.random.Generator) -> dict[str, list]:
    """Shuffle keys and cut them into consecutive parts of the given fractions (the last takes the rest)."""
    order = [keys[i] for i in rng.permutation(len(keys))]
    parts, start = {}, 0
    for index, (name, fraction) in enumerate(fractions.items()):
        end = len(order) if index == len(fractions) - 1 else start + round(fraction * len(order))
        parts[name], start = order[start:end], end
    return parts


def build_drug_reviews(data_dir: Path, rng: np.random.Generator) -> dict:
    rows = [row for row in drug_review_rows(data_dir) if row[3] and "</span>" not in row[3]]  # scraped junk
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    condition_of = {}
    for review_id, _, drug, condition in rows:
        groups[(drug, condition)].append(review_id)
        condition_of[review_id] = condition
    shared = sorted(key for key, members in groups.items() if len(members) >= 2)
    parts = split_keys(shared, {"train": 0.5, "dev": 0.15, "test": 0.35}, rng)
    held_out = {review for part in ("dev", "test") for key in parts[part] for review in groups[key]}
    corpus = [review_id for review_id, *_ in rows]
    result: dict = {}
    for part, keys in parts.items():
        # Negatives and grade-0/1 partners come from the same side of the split as the anchor.
        pool = ([r for r in corpus if r not in held_out] if part == "train"
                else [r for key in keys for r in groups[key]])
        by_condition = defaultdict(list)
        for review_id in pool:
            by_condition[condition_of[review_id]].append(review_id)
        triplets, scored = [], []
        for key in keys:
            for anchor in groups[key]:
                positive = pick([r for r in groups[key] if r != anchor], rng)
                same_condition = [r for r in by_condition[key[1]] if r not in groups[key]]
                other = [r for r in pool if condition_of[r] != key[1]]
                negative = pick(same_condition, rng) if same_condition else pick(other, rng)
                triplets.append([anchor, positive, negative])
                scored.append([anchor, positive, 2.0])
                if same_condition:
                    scored.append([anchor, pick(same_condition, rng), 1.0])
                scored.append([anchor, pick(other, rng), 0.0])
        result[f"{part}-scored"] = scored
        if part == "train":
            result["train"] = triplets
        else:
            queries = [r for key in keys for r in groups[key]]
            relevant = {r: [o for o in groups[key] if o != r] for key in keys for r in groups[key]}
            result[part] = {"queries": queries, "corpus": corpus, "relevant": relevant}
    return result


def build_austen(data_dir: Path, rng: np.random.Generator) -> dict:
    sentences = austen_sentences(data_dir)
    result: dict = {}
    for part, novels in AUSTEN_NOVELS.items():
        chosen = [s for s in sentences if s[2] in novels and len(s[1].split()) >= MIN_WORDS]
        ids = {s[0] for s in chosen}
        pairs = []
        for sentence_id, _, _ in chosen:
            novel, paragraph, index = sentence_id.split(":")
            following = f"{novel}:{paragraph}:{int(index) + 1}"
            if following in ids:
                pairs.append([sentence_id, following])
        if part == "train":
            result["train"] = [pairs[i] for i in sorted(rng.choice(len(pairs), AUSTEN_TRAIN_PAIRS[part], replace=False))]
        else:
            picked = [pairs[i] for i in sorted(rng.choice(len(pairs), AUSTEN_QUERIES[part], replace=False))]
            result[part] = {"queries": [q for q, _ in picked], "corpus": [s[0] for s in chosen],
                            "relevant": {q: [d] for q, d in picked}}
    return result


def build_tweets(data_dir: Path, rng: np.random.Generator) -> dict:
    rows = tweet_rows(data_dir)
    originals: dict[str, list[str]] = defaultdict(list)
    retweets: dict[str, list[str]] = defaultdict(list)
    for tweet_id, text in rows:
        match = RETWEET.match(text)
        (retweets if match else originals)[tweet_key(text[match.end():] if match else text)].append(tweet_id)
    shared = sorted(key for key in retweets if key in originals and key)
    parts = split_keys(shared, {"train": 0.5, "dev": 0.15, "test": 0.35}, rng)
    used = set(shared)
    others = [ids[0] for key, ids in sorted(originals.items()) if key not in used]
    result: dict = {"train": [[retweet, originals[key][0]] for key in parts["train"] for retweet in retweets[key]]}
    for part in ("dev", "test"):
        distractors = [others[i] for i in sorted(rng.choice(len(others), TWEET_DISTRACTORS[part], replace=False))]
        queries = [retweet for key in parts[part] for retweet in retweets[key]]
        relevant = {retweet: originals[key] for key in parts[part] for retweet in retweets[key]}
        corpus = [tweet for key in parts[part] for tweet in originals[key]] + distractors
        result[part] = {"queries": queries, "corpus": corpus, "relevant": relevant}
    return result


def tweet_key(text: str) -> str:
    """What makes two tweets 'the same text': lower case, URLs (shortened differently each time) and spaces aside."""
    return " ".join(URL.sub(" ", text).lower().split())


def pick(candidates: list[str], rng: np.random.Generator) -> str:
    return candidates[int(rng.integers(len(candidates)))]


# ---------------------------------------------------------------- files

def load_split_ids(name: str) -> dict:
    """The committed ids of set `name`; raises ValueError for an unknown set or a checkout without data/retrieval/."""
    check_set_name(name)
    path = SPLITS_FOLDER / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: the split ids ship with the repository's data/retrieval/ folder")
    return json.loads(path.read_text(encoding="utf-8"))


def prepare_set(split_ids: dict, data_dir: Path | None, output: Path) -> dict[str, int]:
    """Write the set's files (see the module docstring) into `output`; returns rows per file.

    Raises ValueError when an id of the split is not in the shared data (a different copy of it).
    """
    texts = source_texts(split_ids["name"], Path(data_dir) if data_dir is not None else None)

    def text(text_id: str) -> str:
        if text_id not in texts:
            raise ValueError(f"{text_id!r} of the {split_ids['name']} split is not in {data_dir}; the shared data "
                             "differs from the one the split was drawn from")
        return texts[text_id]

    output.mkdir(parents=True, exist_ok=True)
    counts = {}
    columns = ["anchor", "positive", "negative"]
    records = [dict(zip(columns, map(text, row))) for row in split_ids["train"]]
    counts["train.jsonl"] = write_jsonl(output / "train.jsonl", records)
    for part in ("train", "dev", "test"):
        if f"{part}-scored" in split_ids:
            records = [{"sentence1": text(a), "sentence2": text(b), "score": score}
                       for a, b, score in split_ids[f"{part}-scored"]]
            counts[f"{part}-scored.jsonl"] = write_jsonl(output / f"{part}-scored.jsonl", records)
        if part in split_ids and isinstance(split_ids[part], dict):
            part_ids = split_ids[part]
            write_retrieval_set(output / part, RetrievalSet(
                part_ids["queries"], [text(q) for q in part_ids["queries"]], part_ids["corpus"],
                [text(d) for d in part_ids["corpus"]], part_ids["relevant"]))
            counts[f"{part}/queries.jsonl"], counts[f"{part}/corpus.jsonl"] = len(part_ids["queries"]), len(part_ids["corpus"])
    return counts


def write_jsonl(path: Path, records: list[dict]) -> int:
    with replaced_file(path) as temporary:
        temporary.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return len(records)
