"""The clients people already run, unchanged, against a live default server (issue 24).

One real uvicorn server on 127.0.0.1 for the module; the answers are checked against
sentence-transformers on the same folder.
"""
import base64
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.background import serving  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402
from serve_support import review_sentences, sbert  # noqa: E402,F401 (sbert: a fixture)


@pytest.fixture(scope="module")
def sentences(data_dir):
    return review_sentences(data_dir, 2048)


@pytest.fixture(scope="module")
def base_url(minilm_dir):
    with serving(create_app(load_models(str(minilm_dir)))) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def vectors_of(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data])


def test_openai_client_one_text_asks_base64_and_gets_float32_vectors(client, sbert, sentences):
    """The openai client asks for base64 by default and decodes it as little-endian float32."""
    response = client.embeddings.create(model="minilm", input=sentences[0], user="someone")
    assert response.model == "minilm" and response.object == "list"
    np.testing.assert_allclose(vectors_of(response)[0], sbert.encode(sentences[0], normalize_embeddings=True),
                               atol=1e-5)
    tokens = len(sbert.tokenizer(sentences[0])["input_ids"])
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (tokens, tokens)


@pytest.mark.parametrize("count", [40, pytest.param(1000, marks=pytest.mark.slow), 2048])
def test_openai_client_sends_up_to_2048_inputs_in_one_call(client, sbert, sentences, count):
    texts = [" ".join(sentence.split()[:4]) for sentence in sentences[:count]]  # short: the count is what is tested
    vectors = vectors_of(client.embeddings.create(model="minilm", input=texts))
    assert vectors.shape == (count, 384)
    rows = np.r_[0:8, count - 8:count]  # both ends: the order survives the server's token-budget batches
    cosines = (vectors[rows] * sbert.encode([texts[i] for i in rows], normalize_embeddings=True)).sum(axis=1)
    assert cosines.min() >= 0.9999


def test_openai_client_dimensions_and_float_format(client, sbert, sentences):
    texts = sentences[:3]
    shortened = vectors_of(client.embeddings.create(model="minilm", input=texts, dimensions=128,
                                                    encoding_format="float"))
    first = sbert.encode(texts, normalize_embeddings=True)[:, :128]
    np.testing.assert_allclose(shortened, first / np.linalg.norm(first, axis=1, keepdims=True), atol=1e-5)
    with pytest.raises(openai.UnprocessableEntityError, match="384"):
        client.embeddings.create(model="minilm", input=texts, dimensions=1024)


def test_openai_client_token_id_inputs(client, sbert, sentences):
    ids = [sbert.tokenizer(text, add_special_tokens=False)["input_ids"] for text in sentences[:3]]
    vectors = vectors_of(client.embeddings.create(model="minilm", input=ids))
    np.testing.assert_allclose(vectors, sbert.encode(sentences[:3], normalize_embeddings=True), atol=1e-5)
    raw = client.embeddings.with_raw_response.create(model="minilm", input=ids[0], encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    np.testing.assert_allclose(decoded, sbert.encode(sentences[0], normalize_embeddings=True), atol=1e-5)


def test_huggingface_hub_inference_client_feature_extraction(base_url, sbert, sentences):
    """InferenceClient(base_url=...) posts to / as to a TEI server; / answers as /embed."""
    from huggingface_hub import InferenceClient

    inference = InferenceClient(base_url=base_url)
    vector = inference.feature_extraction(sentences[0])
    assert vector.shape == (1, 384)
    np.testing.assert_allclose(vector[0], sbert.encode(sentences[0], normalize_embeddings=True), atol=1e-5)
    unnormalised = inference.feature_extraction(sentences[0], normalize=False, truncate=True)
    assert abs(np.linalg.norm(unnormalised[0]) - 1) > 0.01  # the folder's Normalize module left out, as asked


# --- the README's "Use it from the clients you have", run as written ------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"
README_URL = "http://127.0.0.1:8080"


def readme_blocks(language: str) -> list[str]:
    """The code blocks of the README's clients section, in order."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Use it from the clients you have"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def run_readme_block(package: str, base_url: str) -> np.ndarray:
    block = next(b for b in readme_blocks("python") if f"pip install {package}" in b)
    namespace: dict = {}
    exec(block.replace(README_URL, base_url), namespace)  # the README's lines, only the address changed
    return np.array(namespace["vectors"])


@pytest.mark.parametrize("package", ["openai", "langchain-openai", "llama-index-embeddings-openai",
                                     "huggingface_hub"])
def test_readme_client_lines_run_unchanged(base_url, sbert, package):
    pytest.importorskip({"openai": "openai", "langchain-openai": "langchain_openai",
                         "llama-index-embeddings-openai": "llama_index.embeddings.openai",
                         "huggingface_hub": "huggingface_hub"}[package])
    vectors = run_readme_block(package, base_url)
    texts = ["first text", "second text"][:len(vectors)]
    expected = sbert.encode(texts, normalize_embeddings=True)
    assert vectors.shape == expected.shape and (vectors * expected).sum(axis=1).min() >= 0.9999


def test_readme_curl_line(base_url, sbert):
    (block,) = readme_blocks("bash")
    answer = subprocess.run(block.replace(README_URL, base_url), shell=True, capture_output=True, text=True,
                            timeout=60, check=True).stdout
    np.testing.assert_allclose(json.loads(answer), sbert.encode(["first text", "second text"],
                                                                normalize_embeddings=True), atol=1e-5)


def test_token_ids_with_cls_and_sep_are_read_once_as_tei_reads_them(client, base_url, sbert, sentences):
    """Ids as /tokenize and a tokenizer give them by default, [CLS] ... [SEP] included: the server wrapped them again
    (the model read [CLS] [CLS] ... [SEP] [SEP]; cosine 0.958 to the text's vector)."""
    import httpx

    with_specials = [sbert.tokenizer(text)["input_ids"] for text in sentences[:3]]
    expected = sbert.encode(sentences[:3], normalize_embeddings=True)
    np.testing.assert_allclose(vectors_of(client.embeddings.create(model="minilm", input=with_specials,
                                                                   encoding_format="float")), expected, atol=1e-5)
    tokenized = httpx.post(f"{base_url}/tokenize", json={"inputs": sentences[0]}, timeout=120).json()[0]
    embedded = httpx.post(f"{base_url}/embed", json={"inputs": [t["id"] for t in tokenized]}, timeout=120).json()
    np.testing.assert_allclose(embedded[0], expected[0], atol=1e-5)


def test_an_openai_client_given_the_address_without_v1_is_served(base_url, sbert, sentences):
    """TEI answers OpenAI's route at /embeddings too: a client whose base_url lacks /v1 got 404 here."""
    bare = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    vectors = vectors_of(bare.embeddings.create(model="minilm", input=sentences[:2]))
    np.testing.assert_allclose(vectors, sbert.encode(sentences[:2], normalize_embeddings=True), atol=1e-5)
