"""Image files as a source: JPEG and PNG decoded into arrays in the CPU read stage.

An :class:`ImageSource` is a folder, a glob or a list of ``.jpg`` / ``.jpeg`` / ``.png``
files (``format: images``, or inferred from the names). Its rows are the files, in sorted
order, and its units are groups of as many files as decode to at most :data:`UNIT_BYTES`
(at most :data:`UNIT_IMAGES`), so row counts are known at plan time from the listing and
the shape alone. Reading a unit (reader threads locally, read tasks on Ray) decodes its
files with Pillow into two columns:

- ``path``: the file, a string (name it under ``carryover`` to keep it next to the
  predictions);
- ``image``: an Arrow fixed-shape tensor of ``uint8``, ``(height, width, channels)`` per row,
  with 3 channels for ``mode: RGB`` and 1 for ``mode: L``. A model with ``batch_format:
  numpy`` receives it as one ``(rows, height, width, channels)`` array.

Every image must have the same shape: give ``size: [height, width]`` to resize them all
(bilinear, as ``PIL.Image.resize`` with ``Resampling.BILINEAR``), or the shape of the first
image that decodes is the shape and an image of another is a data error. Pixels are taken as
stored (no EXIF rotation); transparency is dropped by the conversion to ``mode``, and a 16-bit
grayscale PNG is scaled to 8 bits.

An image that cannot be decoded follows ``on_bad_input``: ``fail`` stops the job naming the
file; ``skip`` writes that one row (with its carryover, such as ``path``) to the errors
dataset and predicts the rest of its unit. A file rewritten or removed after planning fails
its unit, as any input file does.

.. code-block:: yaml

    input: {path: images/, format: images, size: [32, 32], mode: RGB}
    carryover: [path]
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from chute.errors import ChuteError, ConfigError, DataError
from chute.retry import retrying
from chute.sources.base import FORMATS, Unit, UnreadableRows, unreadable
from chute.sources.files import FileSource, is_glob
from chute.storage import resolve

if TYPE_CHECKING:
    from chute.storage import StorageOptions

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
UNIT_IMAGES = 256
"""The most files a unit holds: what one read task decodes, and what the ledger commits at
once."""
UNIT_BYTES = 128 * 2**20
"""The most decoded bytes a unit of several images holds: a reader holds its unit's pixels
whole, and 256 photos of 12 MP are 9 GB (300 of 2000x1500 took 3.2 GB to run)."""
TENSOR_VALUES = 2**31 - 1
"""The most values one row of an Arrow fixed-shape tensor holds (a 32-bit list size)."""
SHAPE_TRIES = 16
"""Files tried, in order, for the image shape when no ``size`` is given."""
MODES = {"RGB": 3, "L": 1}
"""Pillow modes offered, and the channels each gives."""
PATH, IMAGE = "path", "image"

ImageMode = Literal["RGB", "L"]


@dataclass(frozen=True)
class ImageOptions:
    """How image files become arrays.

    >>> ImageOptions(size=(32, 32)).shape((640, 480))
    (32, 32, 3)
    """

    size: tuple[int, int] | None = None
    """``(height, width)`` to resize every image to; ``None`` keeps the files' own size."""
    mode: ImageMode = "RGB"
    """``RGB`` (3 channels) or ``L`` (grayscale, 1 channel)."""
    unit_images: int | None = None
    """Files per unit; ``None``: as many as decode to at most :data:`UNIT_BYTES`, one at
    least and :data:`UNIT_IMAGES` at most (:meth:`per_unit`)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(
                f"image mode {self.mode!r} is not supported: use one of {', '.join(MODES)}."
            )
        if self.size is not None:
            size = _pair(self.size)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
                raise _bad_size(self.size)
            object.__setattr__(self, "size", size)
            _check_fits(size, MODES[self.mode])
        if self.unit_images is not None and self.unit_images < 1:
            raise ConfigError(f"unit_images must be >= 1, got {self.unit_images}.")

    def shape(self, stored: tuple[int, int]) -> tuple[int, int, int]:
        """The array shape of an image stored as ``(height, width)``."""
        height, width = self.size if self.size is not None else stored
        return (height, width, MODES[self.mode])

    def per_unit(self, shape: tuple[int, int, int]) -> int:
        """Files per unit of images of ``shape``: ``unit_images`` if given, else as many as
        fit in :data:`UNIT_BYTES` decoded (the shape is known at planning, so each unit's
        rows still are).

        >>> ImageOptions().per_unit((1500, 2000, 3))
        14
        """
        if self.unit_images is not None:
            return self.unit_images
        return max(1, min(UNIT_IMAGES, UNIT_BYTES // int(np.prod(shape))))


class ImageSource(FileSource):
    """JPEG / PNG files: a folder, a glob or a list; one row per file.

    >>> ImageSource("photos/", size=(224, 224)).plan()  # doctest: +SKIP
    """

    KEEPS_EMPTY_FILES = True
    KEEPS_UNDERSCORE_FILES = True  # a camera's _DSC0001.JPG was left out without a word
    READS_PARTS = False

    def __init__(
        self,
        path: str | Sequence[str],
        size: Sequence[int] | None = None,
        mode: ImageMode = "RGB",
        unit_images: int | None = None,
        storage: StorageOptions | None = None,
    ) -> None:
        super().__init__(path, "images", storage)
        self.options = ImageOptions(_pair(size), mode, unit_images)
        self._shape: tuple[int, int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the listing: a read task gets its files from its unit (one task per unit
        must not carry every path of a million-image folder)."""
        state = {**super().__getstate__(), "options": self.options, "_shape": self._shape}
        return {**state, "_files": None, "_stamps": {}}

    def _named(self, given: str) -> str | None:
        """The file a path names on its own (not a glob's), as listed."""
        fs, path = resolve(given, self.storage)
        return None if is_glob(fs, path) else path

    def files(self) -> list[str]:
        """The image files, sorted; other files in a folder or matched by a glob are left
        out, a file named on its own that is not JPEG or PNG is refused (it was dropped
        without a word: a ``.webp`` in a list of three left two rows)."""
        if self._files is None:
            listed = super().files()
            named = {path for path in map(self._named, self.paths) if path is not None}
            other = [f for f in listed if f in named and not is_image(f)]
            if other:
                raise DataError(
                    f"input file {other[0]!r}{_more(other)} is not an image chute reads: "
                    "images are JPEG or PNG files named .jpg, .jpeg or .png. Convert it, or "
                    "leave it out of the input."
                )
            self._files = [f for f in listed if is_image(f)]
            if not self._files:
                raise DataError(
                    f"no image files (.jpg, .jpeg, .png) under {', '.join(self.paths)}; found "
                    f"{len(listed)} other file(s), e.g. {listed[0]!r}."
                )
        return self._files

    @property
    def tensor_shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of every row: from ``size``, or the first of the
        first :data:`SHAPE_TRIES` files that decodes whole (:attr:`reference`; one that
        does not is its unit's to fail, or to skip). A header alone is no shape: a
        truncated 64x64 PNG sorting first made every good 16x16 image the wrong shape."""
        if self._shape is None:
            self._shape = self._find_shape()
        return self._shape

    def _find_shape(self) -> tuple[int, int, int]:
        if self.options.size is not None:
            return self.options.shape(self.options.size)
        tried = self.files()[:SHAPE_TRIES]
        errors: list[str] = []
        for path in tried:
            try:
                array = self._decode(path)
            except DataError as exc:
                errors.append(str(exc))
                continue
            self._reference = path
            height, width, channels = array.shape
            return height, width, channels
        raise DataError(
            f"no image to take the shape of the images from: none of the first {len(tried)} "
            f"can be decoded ({', '.join(repr(p) for p in tried)}); the first: {errors[0]} "
            "Set size: [height, width] to give every image that shape (an image that cannot "
            "be decoded then follows on_bad_input), or replace the files."
        )

    def schema(self) -> pa.Schema:
        return pa.schema(
            [(PATH, pa.string()), (IMAGE, pa.fixed_shape_tensor(pa.uint8(), self.tensor_shape))]
        )

    def plan(self) -> list[Unit]:
        files = self.files()
        step = self.options.per_unit(self.tensor_shape)
        row_bytes = int(np.prod(self.tensor_shape))
        units = []
        for index, start in enumerate(range(0, len(files), step)):
            group = files[start : start + step]
            uid = group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}"
            units.append(
                Unit(
                    index,
                    uid,
                    len(group),
                    len(group) * row_bytes,
                    group[0],
                    offset=start,
                    files=tuple(group),
                    listed=tuple(self._stamps.get(f, (None, None)) for f in group),
                )
            )
        return units

    def read(
        self, unit: Unit, columns: Sequence[str] | None, dictionary: Sequence[str] = ()
    ) -> pa.Table:
        """Decode the unit's files; undecodable ones raise :class:`UnreadableRows`, and
        one that is not as listed when planned fails the unit (``dictionary``: Parquet's
        only, never asked of images)."""
        files = list(unit.files[: unit.rows])  # a --limit may cut the unit short
        listed = unit.listed or ((None, None),) * len(files)
        shape = self.tensor_shape
        pixels = np.zeros((len(files), *shape), dtype=np.uint8)
        bad: list[tuple[int, str]] = []
        for row, (path, (size, stamp)) in enumerate(zip(files, listed, strict=False)):
            try:
                pixels[row] = self._decode(path, shape)
            except DataError as exc:
                bad.append((row, str(exc)))
            self._still_listed(path, size, stamp)
        table = self._table(files, pixels, columns, [row for row, _ in bad])
        if bad:
            raise UnreadableRows(
                f"{bad[0][1]} ({len(bad)} of {len(files)} images in this unit cannot be "
                "decoded). Replace or remove the file, or set on_bad_input: skip to write "
                "such images to the errors dataset and go on.",
                table,
                bad,
            )
        return table

    def _table(
        self,
        files: list[str],
        pixels: np.ndarray,
        columns: Sequence[str] | None,
        undecoded: Sequence[int] = (),
    ) -> pa.Table:
        """The unit's rows; an image that could not be decoded is null (its row goes to
        the errors dataset, where zeros would read as a black picture)."""
        image = pa.FixedShapeTensorArray.from_numpy_ndarray(pixels)
        if undecoded:
            mask = np.zeros(len(files), dtype=bool)
            mask[list(undecoded)] = True
            storage = pa.FixedSizeListArray.from_arrays(
                image.storage.values, image.storage.type.list_size, mask=pa.array(mask)
            )
            image = pa.ExtensionArray.from_storage(image.type, storage)
        paths = pa.array([self.uri(f) for f in files], pa.string())  # s3://…, as given
        table = pa.table({PATH: paths, IMAGE: image})
        return (
            table
            if columns is None
            else table.select([c for c in columns if c in table.column_names])
        )

    def _still_listed(self, path: str, size: int | None, stamp: int | None) -> None:
        """The file just read has the size and time it was listed with: one rewritten or
        removed since planning fails its unit (never a row to skip), as a Parquet file
        does, and the run never completes with what it read of it."""
        try:
            retrying(lambda: self._as_listed(path, size, stamp), f"checking {path}")
        except (pa.ArrowException, OSError) as exc:
            raise unreadable(f"image file {path!r}", exc) from exc

    def _decode(self, path: str, shape: tuple[int, int, int] | None = None) -> np.ndarray:
        """The file's pixels, ``(height, width, channels)``; one not of ``shape`` (the
        rows', where known) is a :class:`DataError`."""
        image = _open_image(self._bytes(path), path)
        try:
            image = _eight_bits(image).convert(self.options.mode)
            size = self.options.size
            if size is not None and (image.height, image.width) != size:
                image = image.resize((size[1], size[0]), _pil().Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
        except (OSError, SyntaxError, ValueError, _pil().DecompressionBombError) as exc:
            raise DataError(f"cannot decode image {path!r}: {exc}") from exc
        array = array.reshape(*array.shape[:2], -1)
        if shape is not None and array.shape != shape:
            raise DataError(
                f"image {path!r} is {array.shape[0]}x{array.shape[1]} but {self._reference!r}, "
                f"the image the shape was taken from, is {shape[0]}x{shape[1]}: every row "
                "needs one shape. Set size: [height, width] to resize them all."
            )
        return array

    def _bytes(self, path: str) -> bytes:
        def load() -> bytes:
            with self._open(path) as handle:
                return bytes(handle.read())

        try:
            return retrying(load, f"reading {path}")
        except (pa.ArrowException, OSError) as exc:
            raise unreadable(f"image file {path!r}", exc) from exc

    def describe(self) -> dict[str, Any]:
        options = self.options
        size = list(options.size) if options.size is not None else None
        per_unit = options.per_unit(self.tensor_shape)  # the units: what the ledger keeps
        return {
            **super().describe(),
            "images": {"size": size, "mode": options.mode, "unit_images": per_unit},
        }


def _pair(size: Sequence[int] | None) -> Any:
    """``size`` as a ``(height, width)`` tuple; ``None`` stays ``None``."""
    if size is None:
        return None
    values = tuple(size)
    if len(values) != 2:
        raise _bad_size(size)
    return values


def _check_fits(size: tuple[int, int], channels: int) -> None:
    """An image of ``size`` fits in one row of an Arrow tensor (else Arrow's own error,
    a traceback, came from validate and run alike)."""
    values = size[0] * size[1] * channels
    if values > TENSOR_VALUES:
        raise ConfigError(
            f"image size {list(size)!r} is too large: {size[0]:,} x {size[1]:,} x {channels} "
            f"channel(s) is {values:,} values an image, over the {TENSOR_VALUES:,} (2**31 - 1) "
            "an Arrow tensor row holds. Give a smaller size: [height, width], e.g. "
            "size: [224, 224]."
        )


def _bad_size(size: Sequence[int]) -> ConfigError:
    return ConfigError(
        f"image size {list(size)!r} is not valid: give [height, width], two positive ints, "
        "e.g. size: [224, 224]."
    )


def _pil() -> Any:
    """``PIL.Image``, imported on first use."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ConfigError("reading images needs Pillow: pip install 'chute[images]'.") from exc
    return Image


def _open_image(data: bytes, path: str) -> Any:
    """A lazily decoded Pillow image (header read only), or a DataError naming the file."""
    image = _pil()
    try:
        return image.open(io.BytesIO(data))
    except image.UnidentifiedImageError as exc:
        raise DataError(
            f"cannot decode image {path!r}: not a JPEG or PNG image that Pillow can read."
        ) from exc
    except (OSError, SyntaxError, ValueError, image.DecompressionBombError) as exc:
        raise DataError(f"cannot decode image {path!r}: {exc}") from exc


def _more(paths: Sequence[str]) -> str:
    return f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""


def is_image(path: str) -> bool:
    """Whether ``path`` is named like a JPEG or PNG file."""
    return os.path.splitext(path)[1].lower() in IMAGE_EXTENSIONS


def looks_like_images(paths: str | Sequence[str]) -> bool:
    """Whether ``paths`` name image files: by extension, or a local folder holding images
    and no Parquet, CSV or JSON Lines files. (A remote folder is not listed here: give it
    ``format: images``.)"""
    names = [paths] if isinstance(paths, str) else list(paths)
    if names and all(is_image(p) for p in names):
        return True
    if len(names) != 1 or _has_extension(names[0]) or "://" in names[0]:
        return False
    try:
        listed = FileSource(names[0], "parquet").files()  # a format, so nothing is inferred
    except ChuteError:
        return False
    return any(is_image(f) for f in listed) and not any(_has_extension(f) for f in listed)


def _has_extension(path: str) -> bool:
    """Named like a data file chute reads as a table."""
    return os.path.splitext(path)[1].lower() in FORMATS


SIXTEEN_BITS = ("I;16", "I;16B", "I;16L", "I;16N", "I")
"""Pillow's modes of a 16-bit grayscale PNG (``I`` in older releases)."""


def _eight_bits(image: Any) -> Any:
    """A 16-bit grayscale image scaled to 8 bits (65,535 to 255, rounded): Pillow's
    ``convert`` clips it instead, so every value from 255 up (all but the darkest of a
    16-bit picture) became white."""
    if image.mode not in SIXTEEN_BITS:
        return image
    values = np.asarray(image).astype(np.float64)
    return _pil().fromarray(np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8))
