"""A user function inside a saved estimator: skops does not trust it by default."""

from __future__ import annotations

import numpy as np


def shifted(x: np.ndarray) -> np.ndarray:
    return np.asarray(x) + 1.0
