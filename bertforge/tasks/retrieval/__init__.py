"""Sentence encoders for retrieval and similarity: train a bi-encoder, evaluate it, build real retrieval sets.

    reader.py          pairs / triplets / scored pairs (CSV, TSV, JSONL); retrieval sets in BEIR layout
    losses.py          MNRL (in-batch negatives), CoSENT, cosine MSE, Matryoshka, on sentence vectors
    gradient_cache.py  in-batch negatives over batches larger than memory (GradCache)
    bi_encoder.py      BertModel + pooling + loss; saves and loads sentence-transformers folders
    metrics.py         recall@k, MRR@10, nDCG@10, Spearman
    evaluation.py      any scorer (encoder cosines, BM25, TF-IDF) on a retrieval set or scored pairs
    baselines.py       BM25 (bm25s) and TF-IDF (scikit-learn)
    hybrid.py          BM25 and an encoder fused into one ranking (the search index and adapt use it)
    sets.py            the drug-reviews, austen and tweets sets from the shared data, by id
    recipe.py          the `sbert train` recipe on the one training loop
    commands.py        `bertforge sbert train | evaluate | prepare`
"""
