"""Image sources: JPEG/PNG files decoded with Pillow into fixed-shape tensor rows."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import chute
from chute.config import job_from_dict, load_job
from chute.errors import INPUT_CHANGED
from chute.job.values import AUTO_MEMORY
from chute.plan import build_plan
from chute.sources import UnreadableRows, as_source
from chute.sources.images import UNIT_BYTES, UNIT_IMAGES, ImageSource
from chute.stages import to_format
from tests import s3server

Image = pytest.importorskip("PIL.Image")

COUNT = 600


def _write(folder: Path, count: int, shape: tuple[int, int] = (40, 30), seed: int = 0) -> None:
    """``count`` random images, alternately PNG and JPEG, plus a file that is no image."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:04d}.{'png' if i % 2 else 'jpg'}")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    _write(folder, COUNT)
    return folder


def _pillow(path: str, mode: str = "RGB", size: tuple[int, int] | None = None) -> np.ndarray:
    image = Image.open(path).convert(mode)
    if size is not None:
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(image)
    return array.reshape(*array.shape[:2], -1)


def _read_all(source: ImageSource) -> pa.Table:
    return pa.concat_tables([source.read(unit, None) for unit in source.plan()])


def _pixels(table: pa.Table) -> np.ndarray:
    return np.asarray(to_format(table.select(["image"]), "numpy")["image"])


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="as-stored"),
        pytest.param({"size": (16, 24)}, id="resize"),
        pytest.param({"mode": "L"}, id="grayscale"),
        pytest.param({"size": (8, 8), "mode": "L"}, id="resize-grayscale"),
    ],
)
def test_decoding_equals_pillow(images: Path, options: dict[str, Any]) -> None:
    source = ImageSource(str(images), **options)
    table = _read_all(source)
    pixels = _pixels(table)
    channels = 1 if options.get("mode") == "L" else 3
    assert pixels.shape == (COUNT, *options.get("size", (40, 30)), channels)
    assert pixels.dtype == np.uint8
    assert table.column("path").to_pylist() == sorted(str(p) for p in images.iterdir())
    for row in (0, 1, 257, COUNT - 1):
        path = table.column("path")[row].as_py()
        expected = _pillow(path, options.get("mode", "RGB"), options.get("size"))
        np.testing.assert_array_equal(pixels[row], expected)


def test_units_group_files_and_rows_are_known_from_the_listing(images: Path) -> None:
    units = ImageSource(str(images)).plan()
    assert [u.rows for u in units] == [UNIT_IMAGES, UNIT_IMAGES, COUNT - 2 * UNIT_IMAGES]
    assert units[0].id == f"{images}/img0000.jpg..{images}/img0255.png"
    small = ImageSource(str(images), unit_images=100).plan()
    assert len(small) == 6 and sum(u.rows or 0 for u in small) == COUNT


def test_a_unit_holds_at_most_unit_bytes_of_decoded_images(tmp_path: Path) -> None:
    """Units were 256 images whatever their size: 256 photos of 12 MP are 9 GB decoded, and
    300 of 2000x1500 took 3.2 GB to run. ``unit_images`` still says how many, if given."""
    _write(tmp_path, 30)
    photos = ImageSource(str(tmp_path), size=(1500, 2000)).plan()  # 9 MB an image
    assert [u.rows for u in photos] == [14, 14, 2]
    assert all(UNIT_BYTES / 2 < (u.nbytes or 0) <= UNIT_BYTES for u in photos[:2])
    assert {u.rows for u in ImageSource(str(tmp_path), size=(8000, 8000)).plan()} == {1}
    given = ImageSource(str(tmp_path), size=(1500, 2000), unit_images=5).plan()
    assert [u.rows for u in given] == [5] * 6


def test_auto_batches_of_images_start_within_the_memory_cap(tmp_path: Path) -> None:
    """A fixed-shape tensor was a column of unknown width: ``batch_size: auto`` started at
    1,024 photos, 9 GB of input to the first call."""
    _write(tmp_path, 3)
    model = chute.Model("b", Brightness, inputs=("image",), batch_format="numpy")
    job = chute.Job(source=ImageSource(str(tmp_path), size=(1500, 2000)), models=(model,))
    (stage,) = build_plan(job).stages
    assert stage.batch_rows == AUTO_MEMORY // (1500 * 2000 * 3) == 7
    assert "9,000,000 input bytes a row" in stage.batch_note


def test_schema_is_a_fixed_shape_tensor_and_a_path(images: Path) -> None:
    schema = ImageSource(str(images), size=(32, 32)).schema()
    assert schema.names == ["path", "image"]
    assert schema.field("image").type == pa.fixed_shape_tensor(pa.uint8(), [32, 32, 3])


def test_a_folder_a_glob_and_a_list_are_inferred_as_images(images: Path, tmp_path: Path) -> None:
    files = sorted(str(p) for p in images.glob("*.png"))
    for data in (str(images), str(images / "*.png"), files[:3]):
        assert isinstance(as_source(data), ImageSource), data
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "a.csv", index=False)
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tmp_path / "b.png")
    assert not isinstance(as_source(str(tmp_path)), ImageSource)  # a table beside: not images


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param({"mode": "CMYK"}, "image mode 'CMYK' is not supported", id="mode"),
        pytest.param({"size": (0, 3)}, "image size [0, 3] is not valid", id="size"),
        pytest.param({"size": (4, 4, 3)}, "image size [4, 4, 3] is not valid", id="three"),
        pytest.param(
            {"size": (30000, 30000)},
            "image size [30000, 30000] is too large: 30,000 x 30,000 x 3 channel(s) is "
            "2,700,000,000 values an image, over the 2,147,483,647",
            id="too-large",
        ),
    ],
)
def test_bad_options_are_config_errors(images: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(chute.ConfigError, match=re.escape(message)):
        ImageSource(str(images), **options)


def test_images_of_another_shape_need_a_size(tmp_path: Path) -> None:
    _write(tmp_path, 3)
    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(tmp_path / "z.png")
    source = ImageSource(str(tmp_path))
    shaped = r"z.png' is 10x10 but '.*img0000.jpg', the image the shape was taken from, is 40x30"
    with pytest.raises(UnreadableRows, match=shaped):
        _read_all(source)
    assert _pixels(_read_all(ImageSource(str(tmp_path), size=(5, 5)))).shape == (4, 5, 5, 3)


def _truncated_png(path: Path, shape: tuple[int, int]) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    data = io.BytesIO()
    Image.fromarray(pixels).save(data, format="PNG")
    path.write_bytes(data.getvalue()[: len(data.getvalue()) // 2])


def test_the_shape_is_that_of_the_first_image_that_decodes(tmp_path: Path) -> None:
    """A truncated 64x64 PNG sorting first gave its header's shape to every row: each good
    40x30 image was then the wrong shape, and only the broken one was read."""
    _write(tmp_path, 4)
    _truncated_png(tmp_path / "a_first.png", (64, 64))
    source = ImageSource(str(tmp_path))
    assert source.tensor_shape == (40, 30, 3)
    with pytest.raises(UnreadableRows) as info:
        _read_all(source)
    assert [row for row, _ in info.value.bad] == [0] and "a_first.png" in info.value.bad[0][1]


def test_no_image_that_decodes_to_take_the_shape_from_asks_for_a_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty files sorting first failed planning naming only the last one tried, even under
    on_bad_input: skip, and with no word of ``size``, which reads the rest."""
    monkeypatch.setattr(chute.sources.images, "SHAPE_TRIES", 3)
    _write(tmp_path, 2)
    for i in range(3):
        (tmp_path / f"a{i}.jpg").write_bytes(b"")
    with pytest.raises(chute.DataError) as info:
        ImageSource(str(tmp_path)).schema()
    message = str(info.value)
    assert "none of the first 3 can be decoded" in message
    assert all(f"a{i}.jpg" in message for i in range(3)) and "Set size: [height" in message
    with pytest.raises(UnreadableRows) as bad:
        _read_all(ImageSource(str(tmp_path), size=(8, 8)))
    assert [row for row, _ in bad.value.bad] == [0, 1, 2]


@pytest.fixture
def corrupt(tmp_path: Path) -> Path:
    folder = tmp_path / "corrupt"
    _write(folder, 300)
    (folder / "img0007.png").write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    return folder


class Brightness:
    """A tiny image model: the mean pixel of each image, and its size."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        image = batch["image"]
        assert image.ndim == 4 and image.dtype == np.uint8
        flat = image.reshape(len(image), -1).astype(np.float64)
        return {"mean": flat.mean(axis=1), "height": np.full(len(image), image.shape[1])}


def _job(data: Path, out: Path, engine: str, **job: Any) -> chute.Job:
    model = chute.Model("b", Brightness, inputs=("image",), batch_format="numpy")
    return chute.Job(
        source=ImageSource(str(data), size=(20, 20)),
        models=(model,),
        carryover=("path",),
        output=chute.Sink(str(out)),
        engine=engine,  # type: ignore[arg-type]
        **job,
    )


@pytest.mark.timeout(180)
def test_a_corrupt_image_fails_the_job_naming_the_file(
    corrupt: Path, tmp_path: Path, engine: str
) -> None:
    with pytest.raises(chute.DataError) as info:
        _job(corrupt, tmp_path / "out", engine).run()
    message = str(info.value)
    assert "cannot decode image" in message and "img0007.png" in message
    assert "on_bad_input: skip" in message


@pytest.mark.timeout(180)
def test_a_corrupt_image_is_skipped_and_reported_the_rest_predicted(
    corrupt: Path, tmp_path: Path, engine: str
) -> None:
    report = _job(corrupt, tmp_path / "out", engine, on_bad_input="skip").run()
    out = pd.read_parquet(tmp_path / "out")
    errors = pd.read_parquet(tmp_path / "out" / "_errors")
    assert (report.rows_in, report.rows_out, report.rows_failed) == (300, 299, 1)
    assert list(errors.path) == [str(corrupt / "img0007.png")]
    assert errors.error_type[0] == "DataError" and "cannot decode image" in errors.error_message[0]
    assert str(corrupt / "img0007.png") not in set(out.path) and len(set(out.path)) == 299


@pytest.mark.timeout(180)
def test_an_undecodable_image_carried_to_the_errors_is_null_not_black(
    corrupt: Path, tmp_path: Path, engine: str
) -> None:
    """With the image itself carried, the errors dataset held the undecodable file's row
    with an all-zero image: a black picture that the file never held."""
    job = _job(corrupt, tmp_path / "out", engine, on_bad_input="skip")
    report = dataclasses.replace(job, carryover=("path", "image")).run()
    assert (report.rows_in, report.rows_out, report.rows_failed) == (300, 299, 1)
    errors = pq.read_table(tmp_path / "out" / "_errors")
    assert errors.column("path").to_pylist() == [str(corrupt / "img0007.png")]
    assert errors.column("image").null_count == 1
    out = pq.read_table(tmp_path / "out")
    assert out.column("image").null_count == 0 and out.num_rows == 299
    means = out.column("image").combine_chunks().to_numpy_ndarray().reshape(299, -1).mean(axis=1)
    assert np.allclose(np.sort(means), np.sort(out.column("b_mean").to_numpy()))


@pytest.mark.timeout(180)
def test_many_undecodable_images_skipped_are_not_taken_for_a_broken_model(
    tmp_path: Path, engine: str
) -> None:
    """Two thirds of the images cannot be decoded, under on_bad_input: skip: the run
    stopped as a model that "fails most rows is broken" (exit 4), a model that failed none.
    max_failed_fraction is of a model's failures; the input's bad rows are skipped as told."""
    data = tmp_path / "in"
    _write(data, 10)
    for i in range(20):
        (data / f"zero{i:02d}.png").write_bytes(b"")
    report = _job(data, tmp_path / "out", engine, on_bad_input="skip").run()
    assert (report.rows_in, report.rows_out, report.rows_failed) == (30, 10, 20)
    errors = pd.read_parquet(tmp_path / "out" / "_errors")
    assert sorted(Path(p).name for p in errors.path) == [f"zero{i:02d}.png" for i in range(20)]
    assert set(errors.model) == {"<input row>"}


@pytest.mark.timeout(180)
def test_end_to_end_yaml_job_with_the_path_carried_over(
    images: Path, tmp_path: Path, engine: str
) -> None:
    spec = {
        "input": {"path": str(images), "format": "images", "size": [20, 20], "mode": "RGB"},
        "models": [
            {
                "name": "b",
                "fn": f"{__name__}:Brightness",
                "inputs": ["image"],
                "batch_format": "numpy",
                "batch_size": 100,
            }
        ],
        "carryover": ["path"],
        "output": {"path": str(tmp_path / "out")},
        "engine": engine,
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    job = load_job(str(tmp_path / "job.yaml"))
    assert build_plan(job).total_rows == COUNT
    report = job.run()
    out = pd.read_parquet(tmp_path / "out").sort_values("path")
    assert report.rows_out == COUNT and list(out.columns) == ["path", "b_mean", "b_height"]
    assert list(out.path) == sorted(str(p) for p in images.iterdir())
    for path, mean in zip(out.path[:5], out.b_mean[:5], strict=True):
        assert mean == pytest.approx(_pillow(path, size=(20, 20)).astype(np.float64).mean())
    assert set(out.b_height) == {20}


@pytest.mark.parametrize(
    "given, says",
    [
        pytest.param({}, "the input is not images", id="inferred"),
        pytest.param({"format": "parquet"}, "the input is parquet, not images", id="parquet"),
    ],
)
def test_image_options_on_a_table_input_are_refused(
    tmp_path: Path, given: dict[str, str], says: str
) -> None:
    spec = {
        "input": {"path": str(tmp_path / "x.parquet"), "size": [2, 2], **given},
        "models": [{"name": "b", "fn": f"{__name__}:Brightness"}],
        "output": {"path": str(tmp_path / "out")},
    }
    with pytest.raises(chute.ConfigError, match=f"options of image inputs, but {says}"):
        job_from_dict(spec)


def test_images_beside_a_table_file_ask_for_a_format_images_among_them(tmp_path: Path) -> None:
    """Five images and a labels.csv: the format to set was "parquet, csv or jsonl"."""
    _write(tmp_path, 5)
    (tmp_path / "labels.csv").write_text("a,b\n1,2\n")
    with pytest.raises(chute.DataError, match=r"Set the format: parquet, csv, jsonl or images"):
        as_source(str(tmp_path)).schema()


def test_a_truncated_image_is_an_unreadable_row(tmp_path: Path) -> None:
    _write(tmp_path, 4)
    whole = (tmp_path / "img0001.png").read_bytes()
    (tmp_path / "img0001.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UnreadableRows) as info:
        _read_all(ImageSource(str(tmp_path)))
    assert [row for row, _ in info.value.bad] == [1]
    assert "img0001.png" in str(info.value)


def test_a_pickled_source_carries_no_listing_and_reads_its_units(images: Path) -> None:
    source = ImageSource(str(images), size=(8, 8))
    source.schema()
    units = source.plan()
    shipped = pickle.dumps(source)
    assert len(shipped) < 2_000  # not 600 paths: a read task gets its files from its unit
    copy = pickle.loads(shipped)
    assert copy.read(units[1], None).equals(source.read(units[1], None))


def test_a_limit_cuts_the_images_read(images: Path) -> None:
    model = chute.Model("b", Brightness, inputs=("image",), batch_format="numpy")
    job = chute.Job(source=ImageSource(str(images)), models=(model,), carryover=("path",))
    report = job.run(limit=300)
    assert report.rows_out == 300 and report.result is not None
    assert (
        report.result.column("path").to_pylist() == sorted(str(p) for p in images.iterdir())[:300]
    )


# --------------------------------------------------------------------------- on S3

moto_s3 = s3server.moto_s3  # the fixtures: a moto server on loopback, its proxy, a bucket
s3_proxy = s3server.s3_proxy
s3 = s3server.s3


@pytest.mark.timeout(180)
def test_images_in_a_bucket(
    s3: s3server.FaultProxy, moto_s3: s3server.MotoS3, tmp_path: Path, engine: str
) -> None:
    _write(tmp_path / "local", 40)
    files = sorted((tmp_path / "local").iterdir())
    s3server.put_objects(moto_s3, "bucket", {f"imgs/{p.name}": p.read_bytes() for p in files})
    spec = {
        "input": {"path": "s3://bucket/imgs/", "format": "images", "size": [20, 20]},
        "models": [
            {
                "name": "b",
                "fn": f"{__name__}:Brightness",
                "inputs": ["image"],
                "batch_format": "numpy",
            },
        ],
        "carryover": ["path"],
        "output": {"path": str(tmp_path / "out")},
        "engine": engine,
    }
    report = job_from_dict(spec).run()
    out = pd.read_parquet(tmp_path / "out").sort_values("path")
    assert report.rows_out == 40
    assert list(out.path) == [f"s3://bucket/imgs/{p.name}" for p in files]  # as addressed
    for name, mean in zip(out.path, out.b_mean, strict=True):
        local = tmp_path / "local" / name.rsplit("/", 1)[1]
        assert mean == pytest.approx(_pillow(str(local), size=(20, 20)).astype(np.float64).mean())


def test_a_decompression_bomb_is_an_unreadable_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, 2)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 40×30 is now over twice the limit
    with pytest.raises(UnreadableRows) as info:
        _read_all(ImageSource(str(tmp_path), size=(4, 4)))
    assert [row for row, _ in info.value.bad] == [0, 1]
    assert "decompression bomb" in str(info.value)


def test_a_photo_whose_name_starts_with_an_underscore_is_read(tmp_path: Path) -> None:
    """A camera names photos _DSC0001.JPG (Sony in Adobe RGB): they were left out of the
    listing without a word, like Spark's _SUCCESS. Folders so named, and dot files, still
    are; a Parquet folder still leaves out _-files."""
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    for name in ("_DSC0001.JPG", "a.png", "_thumbs/b.png", ".hidden.png", "_SUCCESS"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        if name.lower().endswith((".jpg", ".png")):
            Image.fromarray(pixels).save(tmp_path / name, format="PNG")
        else:
            (tmp_path / name).write_text("")
    names = sorted(Path(p).name for p in ImageSource(str(tmp_path)).files())
    assert names == ["_DSC0001.JPG", "a.png"]
    globbed = sorted(Path(p).name for p in ImageSource(str(tmp_path / "*.*")).files())
    assert globbed == names  # a glob keeps what the folder's listing keeps
    (tmp_path / "parquet").mkdir()
    for name in ("x.parquet", "_y.parquet"):
        pd.DataFrame({"v": [1]}).to_parquet(tmp_path / "parquet" / name)
    for where in ("parquet", "parquet/*.parquet"):
        files = chute.FileSource(str(tmp_path / where)).files()
        assert [Path(p).name for p in files] == ["x.parquet"]


def test_a_file_named_in_the_input_that_is_not_jpeg_or_png_is_refused(tmp_path: Path) -> None:
    """A .webp and a .tif in a list of three were dropped without a word (one row out);
    a folder or a glob still leaves other files out, as documented."""
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    for name, fmt in [("a.jpg", "JPEG"), ("b.webp", "WEBP"), ("c.tif", "TIFF")]:
        Image.fromarray(pixels).save(tmp_path / name, format=fmt)
    listed = [str(tmp_path / n) for n in ("a.jpg", "b.webp", "c.tif")]
    for named in (listed, listed[1]):
        with pytest.raises(chute.DataError, match=r"b\.webp.* is not an image .* .jpg, .jpeg or"):
            ImageSource(named).files()
    for found in (str(tmp_path), str(tmp_path / "*")):
        assert [Path(p).name for p in ImageSource(found).files()] == ["a.jpg"]


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_a_16_bit_grayscale_png_is_scaled_to_8_bits_not_clipped(tmp_path: Path, mode: str) -> None:
    """Pillow's convert clips a 16-bit picture's values at 255: every pixel but the darkest
    came out white, and the model scored a blank image."""
    values = (np.arange(16, dtype=np.uint16) * 4369).reshape(4, 4)  # 0 .. 65,535
    Image.fromarray(values).save(tmp_path / "scan.png")
    pixels = _pixels(_read_all(ImageSource(str(tmp_path), mode=mode)))  # type: ignore[arg-type]
    expected = (np.arange(16) * 17).reshape(4, 4)  # 4,369 × 255 / 65,535 = 17
    for channel in range(pixels.shape[-1]):
        np.testing.assert_array_equal(pixels[0, :, :, channel], expected)


# --------------------------------------------------------------------------- changed input


def _change(path: Path, how: str) -> None:
    """Rewrite or remove ``path``: ``same size`` (its bytes again, a second later),
    ``other size`` (another picture) or ``removed``."""
    before = path.stat()
    if how == "removed":
        path.unlink()
    elif how == "same size":
        path.write_bytes(path.read_bytes())
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    else:
        Image.fromarray(np.full((40, 30, 3), 255, np.uint8)).save(path)
        assert path.stat().st_size != before.st_size


@pytest.mark.parametrize(
    "how, says",
    [
        pytest.param("same size", "was modified after", id="same-size"),
        pytest.param("other size", "was modified after", id="other-size"),
        pytest.param("removed", "was removed after", id="removed"),
    ],
)
def test_an_image_changed_after_planning_fails_its_unit(
    tmp_path: Path, how: str, says: str
) -> None:
    """An image rewritten after planning was read with its new content and the run ended
    complete; a Parquet or CSV file so changed fails its unit. It is no row to skip: what
    was read of the file may be neither version."""
    _write(tmp_path, 6)
    source = ImageSource(str(tmp_path), unit_images=3)
    units = source.plan()
    _change(tmp_path / "img0004.jpg", how)
    shipped = pickle.loads(pickle.dumps(source))  # as a read task gets it: no listing
    assert shipped.read(units[0], None).num_rows == 3  # its files are as listed
    with pytest.raises(chute.DataError, match=f"{says} the job was planned") as info:
        shipped.read(units[1], None)
    assert not isinstance(info.value, UnreadableRows)
    assert "img0004.jpg" in str(info.value) and INPUT_CHANGED in str(info.value)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("on_bad_input", ["fail", "skip"])
def test_an_image_rewritten_while_the_job_runs_fails_the_job(
    tmp_path: Path, on_bad_input: str
) -> None:
    """The model's first call rewrites the last image, which the readers reach later (a
    channel holds a few units): the job fails naming it, never complete. Under skip it
    finished complete, its unit's rows left out, and the job run again was another job."""
    _write(tmp_path / "in", 40)
    last = tmp_path / "in" / "img0039.png"

    def rewrite(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not (tmp_path / "done").exists():
            (tmp_path / "done").touch()
            Image.fromarray(np.full((40, 30, 3), 255, np.uint8)).save(last)
        return {"mean": batch["image"].reshape(len(batch["image"]), -1).mean(axis=1)}

    model = chute.Model("m", rewrite, inputs=("image",), batch_format="numpy", batch_size=1)
    job = chute.Job(
        source=ImageSource(str(tmp_path / "in"), unit_images=1),
        models=(model,),
        carryover=("path",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
        on_bad_input=on_bad_input,  # type: ignore[arg-type]
    )
    with pytest.raises(chute.InputChanged, match="changed during the run") as info:
        job.run()
    assert "img0039.png" in str(info.value)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.timeout(180)
def test_an_image_rewritten_in_a_bucket_after_planning_fails_its_unit(
    s3: s3server.FaultProxy, moto_s3: s3server.MotoS3, tmp_path: Path
) -> None:
    _write(tmp_path, 6)
    files = sorted(tmp_path.iterdir())
    s3server.put_objects(moto_s3, "bucket", {f"imgs/{p.name}": p.read_bytes() for p in files})
    source = ImageSource("s3://bucket/imgs/", unit_images=3)
    units = source.plan()
    s3server.put_objects(moto_s3, "bucket", {"imgs/img0004.jpg": files[0].read_bytes()[:-1]})
    shipped = pickle.loads(pickle.dumps(source))
    assert shipped.read(units[0], None).num_rows == 3
    with pytest.raises(chute.DataError, match=r"img0004\.jpg' was modified after the job was"):
        shipped.read(units[1], None)


def test_a_folder_whose_name_looks_like_a_glob_is_read_as_named(tmp_path: Path) -> None:
    """``shots[raw]/`` was the pattern ``shots`` + one of ``r``, ``a``, ``w``: "matches no
    files"; ``q?.png`` matched ``qa.png`` too, an extra row."""
    _write(tmp_path / "shots[raw]", 3)
    assert len(ImageSource(str(tmp_path / "shots[raw]")).files()) == 3
    for name in ("q?.png", "qa.png"):
        Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tmp_path / name)
    assert ImageSource(str(tmp_path / "q?.png")).files() == [str(tmp_path / "q?.png")]


def test_an_image_column_sent_to_csv_is_refused_before_any_compute(
    images: Path, tmp_path: Path
) -> None:
    """Arrow's tensor type is not a ``pa.ExtensionType``: the plan let it through, the
    model ran, and the writer failed with Arrow's message (exit 3)."""
    spec = {
        "input": {"path": str(images), "format": "images"},
        "models": [{"name": "b", "fn": f"{__name__}:Brightness", "inputs": ["image"]}],
        "carryover": ["path", "image"],
        "output": {"path": str(tmp_path / "out"), "format": "csv"},
    }
    with pytest.raises(chute.ConfigError, match=r"'image'.*CSV|CSV.*'image'"):
        build_plan(job_from_dict(spec))
