"""The torch adapter on a small MLP built here: TorchScript, torch.export, state dict and
safetensors plus a module class, and a pickled module only with trust_pickle; each chute
output equals calling the module directly on the same rows."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import chute
from chute.models import adapter

torch = pytest.importorskip("torch")

FEATURES = 5
ROWS = 300


class MLP(torch.nn.Module):  # type: ignore[misc]
    """The test's model; importable as ``tests.test_adapters_torch:MLP`` by Ray workers."""

    def __init__(self, width: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


MLP_SOURCE = textwrap.dedent(
    """
    import torch

    class Net(torch.nn.Module):
        def __init__(self, width=16, classes=3):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(5, width), torch.nn.ReLU(), torch.nn.Linear(width, classes)
            )

        def forward(self, x):
            return self.net(x)
    """
)


@pytest.fixture(scope="module")
def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(width=16, classes=3).eval()


@pytest.fixture(scope="module")
def rows() -> pa.Table:
    rng = np.random.default_rng(1)
    data = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    columns = {f"f{i}": data[:, i] for i in range(FEATURES)}
    return pa.table({"id": np.arange(ROWS), **columns})


def direct(module: Any, table: pa.Table) -> np.ndarray:
    x = np.column_stack([table.column(f"f{i}").to_numpy() for i in range(FEATURES)])
    with torch.inference_mode():
        return np.asarray(module(torch.from_numpy(x.astype(np.float32))).numpy())


def features() -> list[str]:
    return [f"f{i}" for i in range(FEATURES)]


def run(table: pa.Table, engine: str, batch_size: int = 64, **options: Any) -> Any:
    model = chute.Model(
        "mlp", adapter("torch", **options), inputs=features(), batch_size=batch_size
    )
    return chute.predict(table, model, engine=engine)  # type: ignore[arg-type]


def matrix(frame: Any, column: str) -> np.ndarray:
    return np.stack(frame[column].to_numpy()).astype(np.float32)


def save_torchscript(module: Any, path: Path) -> str:
    torch.jit.script(module).save(str(path))
    return str(path)


def save_exported(module: Any, path: Path) -> str:
    program = torch.export.export(
        module, (torch.zeros(4, FEATURES),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(program, str(path))
    return str(path)


def save_state_dict(module: Any, path: Path) -> dict[str, Any]:
    torch.save(module.state_dict(), str(path))
    (path.parent / "net.py").write_text(MLP_SOURCE)
    return {"path": str(path), "module": f"{path.parent / 'net.py'}:Net"}


def save_safetensors(module: Any, path: Path) -> dict[str, Any]:
    from safetensors.torch import save_file

    save_file(module.state_dict(), str(path))
    return {"path": str(path), "module": "tests.test_adapters_torch:MLP", "kwargs": {"width": 16}}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param("torchscript", id="torchscript"),
        pytest.param("export", id="torch.export"),
        pytest.param("state_dict", id="state-dict+file.py"),
        pytest.param("safetensors", id="safetensors+module"),
    ],
)
def test_outputs_equal_the_module(
    fmt: str, mlp: Any, rows: pa.Table, tmp_path: Path, engine: str
) -> None:
    options: dict[str, Any] = {
        "torchscript": lambda: {"path": save_torchscript(mlp, tmp_path / "m.ts")},
        "export": lambda: {"path": save_exported(mlp, tmp_path / "m.pt2")},
        "state_dict": lambda: save_state_dict(mlp, tmp_path / "m.pt"),
        "safetensors": lambda: save_safetensors(mlp, tmp_path / "m.safetensors"),
    }[fmt]()
    frame = run(rows, engine, **options)
    assert frame["id"].tolist() == list(range(ROWS))
    np.testing.assert_allclose(matrix(frame, "mlp_output"), direct(mlp, rows), atol=1e-5)


def test_output_is_fixed_size_list_of_float32(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    path = save_torchscript(mlp, tmp_path / "m.ts")
    model = chute.Model("mlp", adapter("torch", path=path), inputs=features())
    report = chute.Job(
        source=chute.TableSource(rows), models=(model,), carryover=("id",), engine="local"
    ).run()
    assert report.result is not None
    assert report.result.schema.field("mlp_output").type == pa.list_(pa.float32(), 3)


def test_classification_gives_logits_label_and_score(
    mlp: Any, rows: pa.Table, tmp_path: Path
) -> None:
    path = save_torchscript(mlp, tmp_path / "m.ts")
    frame = run(rows, "local", path=path, task="classification", labels=["a", "b", "c"])
    logits = direct(mlp, rows)
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    np.testing.assert_allclose(matrix(frame, "mlp_logits"), logits, atol=1e-5)
    assert frame["mlp_label"].tolist() == [["a", "b", "c"][i] for i in logits.argmax(axis=1)]
    np.testing.assert_allclose(frame["mlp_score"].to_numpy(), probs.max(axis=1), atol=1e-5)


def test_one_logit_is_a_binary_classifier(rows: pa.Table, tmp_path: Path) -> None:
    """A softmax over one logit is 1: every row was labelled 0 with score 1.0."""
    torch.manual_seed(3)
    binary = MLP(width=8, classes=1).eval()
    path = save_torchscript(binary, tmp_path / "b.ts")
    logit = direct(binary, rows)[:, 0]
    assert 0 < (logit > 0).sum() < ROWS
    frame = run(rows, "local", path=path, task="classification", labels=["no", "yes"])
    assert frame["mlp_label"].tolist() == ["yes" if v > 0 else "no" for v in logit]
    np.testing.assert_allclose(frame["mlp_score"].to_numpy(), 1 / (1 + np.exp(-logit)), atol=1e-5)
    np.testing.assert_allclose(frame["mlp_logits"].to_numpy(), logit, atol=1e-5)
    with pytest.raises(chute.ModelError, match=r"one output .* has two classes"):
        run(rows, "local", path=path, task="classification", labels=["a", "b", "c"])


class Normed(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(FEATURES, 4), torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.linear(x)))


def test_a_program_exported_in_training_mode_is_refused(rows: pa.Table, tmp_path: Path) -> None:
    """Its batch norm and dropout ran as in training: two runs differed by up to 3.19."""
    evaluated = run(rows, "local", path=save_exported(Normed().eval(), tmp_path / "eval.pt2"))
    assert evaluated["mlp_output"].notna().all()
    path = save_exported(Normed().train(), tmp_path / "train.pt2")
    with pytest.raises(chute.ModelError, match=r"exported in training mode .* after model.eval"):
        run(rows, "local", path=path)


class Noisy(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.drop = torch.nn.Linear(FEATURES, 3), torch.nn.Dropout(0.5)
        self.norm, self.act = torch.nn.BatchNorm1d(3), torch.nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.drop(self.linear(x))))


@pytest.mark.parametrize("form", ["traced", "decomposed"])
def test_a_model_traced_or_decomposed_in_training_mode_is_refused(
    form: str, rows: pa.Table, tmp_path: Path
) -> None:
    """Tracing writes dropout's flag into the graph, and a decomposed program names its
    operators otherwise (native_dropout): both ran in training mode, each run's values
    other than the last's, exit 0. Traced after eval(), it runs as the module does."""
    torch.manual_seed(0)
    net, example = Noisy(), torch.zeros(8, FEATURES)
    path = str(tmp_path / "m")
    if form == "traced":
        torch.jit.trace(net, example, check_trace=False).save(path)
    else:
        batch = {0: torch.export.Dim("batch")}
        program = torch.export.export(net, (example,), dynamic_shapes=(batch,))
        torch.export.save(program.run_decompositions(), path)
    with pytest.raises(chute.ModelError, match=f"was {form.replace('decomposed', 'exported')} "
                       "in training mode .*again after model.eval"):  # fmt: skip
        run(rows, "local", path=path)
    if form == "traced":
        torch.jit.trace(net.eval(), example).save(path)
        frame = run(rows, "local", path=path)
        assert np.allclose(matrix(frame, "mlp_output"), direct(net, rows), atol=1e-5)


class Recurrent(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.drop = torch.nn.LSTM(FEATURES, 3, batch_first=True), torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.rnn(x.unsqueeze(1))[0][:, 0, :])


def test_a_module_traced_in_training_mode_whose_training_changes_nothing_runs(
    rows: pa.Table, tmp_path: Path
) -> None:
    """An LSTM (dropout 0, its default) and a Dropout(0.0), traced without eval(): the
    same values in training mode, so nothing to refuse."""
    torch.manual_seed(0)
    net, path = Recurrent(), str(tmp_path / "rnn.ts")
    torch.jit.trace(net, torch.zeros(8, FEATURES)).save(path)
    frame = run(rows, "local", path=path)
    assert np.allclose(matrix(frame, "mlp_output"), direct(net.eval(), rows), atol=1e-5)


def test_regression_output_is_value(rows: pa.Table, tmp_path: Path) -> None:
    torch.manual_seed(2)
    regressor = MLP(width=8, classes=1).eval()
    path = save_exported(regressor, tmp_path / "r.pt2")
    frame = run(rows, "local", path=path)
    assert frame["mlp_value"].dtype == np.float32
    np.testing.assert_allclose(
        frame["mlp_value"].to_numpy(), direct(regressor, rows)[:, 0], atol=1e-5
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_casts_model_and_inputs(dtype: str, mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    options = save_safetensors(mlp, tmp_path / "m.safetensors")
    frame = run(rows, "local", dtype=dtype, **options)
    cast = getattr(torch, dtype)
    x = np.column_stack([rows.column(f"f{i}").to_numpy() for i in range(FEATURES)])
    low = MLP(16, 3).eval()
    low.load_state_dict(mlp.state_dict())
    low = low.to(cast)
    with torch.inference_mode():
        expected = low(torch.from_numpy(x).to(cast)).float().numpy()
    np.testing.assert_allclose(matrix(frame, "mlp_output"), expected, atol=1e-5)
    assert np.abs(expected - direct(mlp, rows)).max() > 1e-5  # the cast really happened


def test_tensor_column_used_as_is(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    x = np.column_stack([rows.column(f"f{i}").to_numpy() for i in range(FEATURES)])
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), FEATURES)})
    path = save_torchscript(mlp, tmp_path / "m.ts")
    frame = chute.predict(
        table, chute.Model("mlp", adapter("torch", path=path), inputs=["x"]), engine="local"
    )
    np.testing.assert_allclose(matrix(frame, "mlp_output"), direct(mlp, rows), atol=1e-5)


def test_pickled_module_needs_trust_pickle(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    path = tmp_path / "full.pt"
    torch.save(mlp, str(path))
    with pytest.raises(chute.ConfigError, match="trust_pickle"):
        run(rows, "local", path=str(path))
    frame = run(rows, "local", path=str(path), trust_pickle=True)
    np.testing.assert_allclose(matrix(frame, "mlp_output"), direct(mlp, rows), atol=1e-5)


def test_state_dict_with_code_in_it_is_refused(rows: pa.Table, tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"net.0.weight": torch.zeros(2), "hook": Path("x")}, str(path))
    (tmp_path / "net.py").write_text(MLP_SOURCE)
    with pytest.raises(chute.ConfigError, match="weights_only"):
        run(rows, "local", path=str(path), module=f"{tmp_path / 'net.py'}:Net")


def test_weights_that_do_not_fit_the_module(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    options = save_safetensors(mlp, tmp_path / "m.safetensors")
    options["kwargs"] = {"width": 8}
    with pytest.raises(chute.ModelError, match="do not fit"):
        run(rows, "local", **options)


def test_a_checkpoint_none_of_whose_keys_fit_is_refused_even_when_not_strict(
    mlp: Any, rows: pa.Table, tmp_path: Path
) -> None:
    """A DataParallel checkpoint (keys ``module.net.0.weight``) with ``strict: false``
    loaded nothing: the class's random weights ran, exit 0."""
    path = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in mlp.state_dict().items()}, str(path))
    options = {"path": str(path), "module": "tests.test_adapters_torch:MLP", "strict": False}
    with pytest.raises(chute.ModelError, match=r"no weight in .* fits .*strip 'module\.'"):
        run(rows, "local", **options)


class Identity(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_an_integer_float32_cannot_hold_is_refused_not_rounded(tmp_path: Path) -> None:
    """Stacked into the float32 input, the id 16,777,217 reached the model as 16,777,216."""
    path = save_torchscript(Identity(), tmp_path / "id.ts")
    model = chute.Model("m", adapter("torch", path=path), inputs=("user_id",))
    fits = chute.predict(pa.table({"user_id": [1, 2**24]}), model, engine="local")
    assert np.stack(fits["m_value"]).ravel().tolist() == [1.0, 2.0**24]
    with pytest.raises(chute.ChuteError, match="'user_id' holds 16,777,217, which the stacked"):
        chute.predict(pa.table({"user_id": [1, 2**24 + 1]}), model, engine="local")


def bfloat16_out(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"y": torch.from_numpy(batch["x"]).to(torch.bfloat16) * 2}


def test_a_bfloat16_tensor_a_function_returns_is_written_as_float32() -> None:
    """NumPy has no bfloat16: the run stopped blaming the model "on row 0"."""
    model = chute.Model("m", bfloat16_out, inputs=("x",), batch_format="numpy")
    frame = chute.predict(pa.table({"x": [0.5, 1.5, 3.0]}), model, engine="local")
    assert frame["m_y"].dtype == np.float32 and frame["m_y"].tolist() == [1.0, 3.0, 6.0]


def test_changed_weights_change_the_fingerprint(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    path = save_torchscript(mlp, tmp_path / "m.ts")
    model = chute.Model("mlp", adapter("torch", path=path), inputs=features())
    job = chute.Job(source=chute.TableSource(rows), models=(model,))
    before = job.fingerprint()
    torch.manual_seed(5)
    save_torchscript(MLP(16, 3).eval(), tmp_path / "m.ts")
    assert job.fingerprint() != before


def test_outputs_renames_and_drops_columns(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    path = save_torchscript(mlp, tmp_path / "m.ts")
    renames = {"logits": "raw", "score": None}
    frame = run(rows, "local", path=path, task="classification", outputs=renames)
    assert [c for c in frame.columns if c.startswith("mlp_")] == ["mlp_raw", "mlp_label"]
    np.testing.assert_allclose(matrix(frame, "mlp_raw"), direct(mlp, rows), atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"dtyp": "float16"}, "no option 'dtyp'. Did you mean 'dtype'", id="option"),
        pytest.param({"dtype": "float8"}, "dtype 'float8' is not one of", id="dtype"),
        pytest.param({"task": "classify"}, "Did you mean 'classification'", id="task"),
    ],
)
def test_bad_options_fail_before_loading(
    options: dict[str, Any], message: str, mlp: Any, rows: pa.Table, tmp_path: Path
) -> None:
    path = save_torchscript(mlp, tmp_path / "m.ts")
    with pytest.raises(chute.ConfigError, match=message):
        run(rows, "local", path=path, **options)


def test_yaml_job_with_a_module_file_next_to_it(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    """``model: {type: torch, path: ..., module: net.py:Net}``, both relative to the job."""
    import pyarrow.parquet as pq

    from chute.config import load_job

    save_state_dict(mlp, tmp_path / "weights.pt")
    (tmp_path / "data").mkdir()
    pq.write_table(rows, tmp_path / "data" / "rows.parquet")
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            f"""\
            input: data/
            carryover: [id]
            models:
              - name: mlp
                model: {{type: torch, path: weights.pt, module: "net.py:Net", task: classification}}
                inputs: [{", ".join(features())}]
            output: out/
            """
        )
    )
    load_job(str(tmp_path / "job.yaml"), engine="local").run()
    result = pq.read_table(tmp_path / "out").sort_by("id")
    assert result.column_names == ["id", "mlp_logits", "mlp_label", "mlp_score"]
    logits = np.stack(result.column("mlp_logits").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(logits, direct(mlp, rows), atol=1e-5)


class ArgMax(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=1)


def test_embedding_task_and_integer_outputs(mlp: Any, rows: pa.Table, tmp_path: Path) -> None:
    frame = run(rows, "local", path=save_torchscript(mlp, tmp_path / "m.ts"), task="embedding")
    np.testing.assert_allclose(matrix(frame, "mlp_embedding"), direct(mlp, rows), atol=1e-5)
    frame = run(rows, "local", path=save_torchscript(ArgMax(), tmp_path / "argmax.ts"))
    x = np.column_stack([rows.column(f"f{i}").to_numpy() for i in range(FEATURES)])
    assert frame["mlp_value"].dtype == np.int64
    assert frame["mlp_value"].tolist() == x.argmax(axis=1).tolist()


class TinyConv(torch.nn.Module):  # type: ignore[misc]
    """An image classifier over ``(N, 3, H, W)`` float pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(x / 255.0)).mean(dim=(2, 3))
        return self.head(features)


@pytest.mark.timeout(180)
def test_image_files_feed_a_torch_classifier(tmp_path: Path, engine: str) -> None:
    """Images decoded in the CPU read stage, ``(H, W, C)`` uint8, to a conv net."""
    from PIL import Image

    from chute.sources.images import ImageSource

    rng = np.random.default_rng(4)
    folder = tmp_path / "images"
    folder.mkdir()
    pixels = rng.integers(0, 255, size=(12, 16, 20, 3), dtype=np.uint8)
    for i, image in enumerate(pixels):
        Image.fromarray(image).save(folder / f"{i:02d}.png")
    torch.manual_seed(3)
    net = TinyConv().eval()
    torch.jit.script(net).save(str(tmp_path / "conv.ts"))
    model = chute.Model(
        "cls",
        adapter(
            "torch", path=str(tmp_path / "conv.ts"), task="classification", channels_first=True
        ),
        inputs=["image"],
        batch_size=5,
    )
    report = chute.Job(
        source=ImageSource(str(folder)), models=(model,), carryover=("path",), engine=engine
    ).run()  # type: ignore[arg-type]
    assert report.result is not None
    frame = report.result.to_pandas().sort_values("path")
    with torch.inference_mode():
        logits = net(torch.from_numpy(pixels).permute(0, 3, 1, 2).float()).numpy()
    np.testing.assert_allclose(np.stack(frame["cls_logits"].to_numpy()), logits, atol=1e-5)
    assert frame["cls_label"].tolist() == logits.argmax(axis=1).tolist()
