"""The BERT model: config, encoder, task heads, typed outputs and Hugging Face checkpoint IO."""
