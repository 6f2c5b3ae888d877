"""Stage logic shared by every engine: plain classes over Arrow tables, no engine inside.

- :mod:`~chute.stages.rows`: the row key and the failure columns every row carries;
- :mod:`~chute.stages.convert`: batch formats in (pandas, NumPy, Arrow) and outputs back;
- :mod:`~chute.stages.model`: :class:`ModelStage`, one replica of a model;
- :mod:`~chute.stages.steps`: the preprocess and an adapter's prepare step;
- :mod:`~chute.stages.clock`: what each replica measures;
- :mod:`~chute.stages.batching`: how many rows each model call takes (fixed, or ``auto``).

An engine builds these from the plan and moves batches between them; what they do to a
batch does not depend on the engine.
"""

from chute.stages.batching import Batching, BatchSizer
from chute.stages.clock import StageClock
from chute.stages.convert import cast_exactly, holds_null, to_columns, to_format, typed_by
from chute.stages.model import TIMEOUT_RETRIES, ModelStage, OutputTypes
from chute.stages.rows import (
    EMPTY,
    ERROR_COLUMNS,
    ERROR_MESSAGE,
    ERROR_MODEL,
    ERROR_TYPE,
    KEY,
    OUTPUT_OF,
    ROW_BITS,
    ROW_MASK,
    SKIPPED,
    UNREADABLE,
    decode,
    empty_marker,
    mark_failed,
    skip_marker,
    tag,
)
from chute.stages.steps import PrepareStage, PreprocessStage, preparer

__all__ = [
    "EMPTY",
    "ERROR_COLUMNS",
    "ERROR_MESSAGE",
    "ERROR_MODEL",
    "ERROR_TYPE",
    "KEY",
    "OUTPUT_OF",
    "ROW_BITS",
    "ROW_MASK",
    "SKIPPED",
    "TIMEOUT_RETRIES",
    "UNREADABLE",
    "BatchSizer",
    "Batching",
    "ModelStage",
    "OutputTypes",
    "PrepareStage",
    "PreprocessStage",
    "StageClock",
    "cast_exactly",
    "decode",
    "empty_marker",
    "holds_null",
    "mark_failed",
    "preparer",
    "skip_marker",
    "tag",
    "to_columns",
    "to_format",
    "typed_by",
]
