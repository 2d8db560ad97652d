"""WordPiece tokenization on the `tokenizers` engine: load any BERT vocabulary, train one, encode text."""
