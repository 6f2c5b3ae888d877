"""The exception tree: one root, an exit code per class, and the "Did you mean" hint."""

from __future__ import annotations

import pytest

import chute
from chute.errors import (
    ChuteError,
    ColumnNotFoundError,
    ConfigError,
    DataError,
    InputChanged,
    JobStateError,
    ModelError,
    ResourceError,
    StallError,
    StorageError,
    did_you_mean,
    missing_columns_error,
)


@pytest.mark.parametrize(
    ("cls", "parent", "code"),
    [
        pytest.param(ChuteError, Exception, 1, id="ChuteError"),
        pytest.param(ConfigError, ChuteError, 2, id="ConfigError"),
        pytest.param(ColumnNotFoundError, ConfigError, 2, id="ColumnNotFoundError"),
        pytest.param(DataError, ChuteError, 3, id="DataError"),
        pytest.param(InputChanged, DataError, 3, id="InputChanged"),
        pytest.param(ModelError, ChuteError, 4, id="ModelError"),
        pytest.param(JobStateError, ChuteError, 5, id="JobStateError"),
        pytest.param(ResourceError, ChuteError, 6, id="ResourceError"),
        pytest.param(StallError, ResourceError, 7, id="StallError"),
        pytest.param(StorageError, ChuteError, 1, id="StorageError"),
    ],
)
def test_error_tree_and_exit_codes(cls: type[ChuteError], parent: type, code: int) -> None:
    assert issubclass(cls, ChuteError)
    assert cls.__bases__ == (parent,)
    assert cls.exit_code == code
    assert cls("boom").exit_code == code
    assert getattr(chute, cls.__name__) is cls


def test_every_error_class_in_the_module_is_covered() -> None:
    import chute.errors as errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert classes == {
        "ChuteError",
        "ConfigError",
        "ColumnNotFoundError",
        "DataError",
        "InputChanged",
        "ModelError",
        "JobStateError",
        "ResourceError",
        "StallError",
        "StorageError",
    }


@pytest.mark.parametrize(
    ("name", "choices", "expected"),
    [
        pytest.param("fare", ["fare_amount", "tip"], "", id="too-far"),
        pytest.param(
            "fare_amont", ["fare_amount", "tip"], " Did you mean 'fare_amount'?", id="typo"
        ),
        pytest.param("TIP", ["tip"], "", id="case-differs-too-much"),
        pytest.param("tips", ["tips_total", "tip"], " Did you mean 'tip'?", id="closest"),
        pytest.param("x", [], "", id="no-choices"),
    ],
)
def test_did_you_mean(name: str, choices: list[str], expected: str) -> None:
    assert did_you_mean(name, choices) == expected


def test_did_you_mean_accepts_any_iterable() -> None:
    assert did_you_mean("pasenger", iter(["passenger", "fare"])) == " Did you mean 'passenger'?"


def test_missing_columns_error_lists_hint_and_available_columns() -> None:
    err = missing_columns_error(["fare_amont"], ["fare_amount", "tip"], "carryover")
    assert isinstance(err, ColumnNotFoundError)
    text = str(err)
    assert text.startswith("carryover: column(s) 'fare_amont' not found")
    assert "Did you mean 'fare_amount'?" in text
    assert text.endswith("Available columns: fare_amount, tip.")


# -- the boundary: what ends a run is translated by type, the same on every engine ------


def test_translate_maps_by_type_and_keeps_chute_errors() -> None:
    import pyarrow as pa

    from chute.errors import ChuteError, DataError, ModelError, ResourceError, translate

    kept = ModelError("m failed")
    assert translate(kept) is kept
    assert type(translate(pa.lib.ArrowInvalid("bad cast"))) is DataError
    assert "ArrowInvalid: bad cast" in str(translate(pa.lib.ArrowInvalid("bad cast")))
    assert type(translate(MemoryError())) is ResourceError
    io = translate(FileNotFoundError(2, "No such file", "/x/y"))
    assert type(io) is ChuteError and "/x/y" in str(io)
    other = translate(KeyError("k"))
    assert type(other) is ChuteError and "KeyError" in str(other)
