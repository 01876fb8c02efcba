"""The cost-model prior's trained booster, kept between runs.

Training MetaSchedule's XGBoost model on the shipped prior (thousands of schedules) takes
seconds on two cores, and every tune paid them before its first candidate was ranked: a
sizeable share of a one-minute budget. The booster a training gives depends only on its data,
the model's configuration and the XGBoost version, so it is written, once trained, to the
user's cache directory under a digest of all of them, and a later run with the same digest
loads it instead of training. ``STORMDROP_CACHE`` names another directory, or ``off`` (train
every time). A cache that cannot be read or written costs the training, never the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("stormdrop")


def cache_dir() -> Path | None:
    """Where boosters are kept: ``$STORMDROP_CACHE`` (``off``: nowhere) or the user's cache directory."""
    env = os.environ.get("STORMDROP_CACHE", "").strip()
    if env.lower() in ("off", "0", "no", "none"):
        return None
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("stormdrop", appauthor=False))


def digest(model: Any, xs: Sequence[np.ndarray], ys: np.ndarray) -> str:
    """What determines ``model``'s booster trained on ``xs``/``ys``: the data, the model's
    training configuration, and the XGBoost and TVM versions that train it."""
    import tvm
    import xgboost as xgb

    h = hashlib.sha256()
    for part in (xgb.__version__, tvm.__version__, json.dumps(model.config.to_dict(), sort_keys=True),
                 str(model.early_stopping_rounds), str(model.average_peak_n), str(len(xs))):
        h.update(part.encode() + b"\0")
    for x in xs:
        x = np.ascontiguousarray(x)
        h.update(f"{x.dtype}{x.shape}".encode())
        h.update(x.tobytes())
    h.update(np.ascontiguousarray(ys).tobytes())
    return h.hexdigest()[:32]


def trained_booster(model: Any, xs: Sequence[np.ndarray], ys: np.ndarray, train: Callable[[], Any]) -> Any:
    """``model``'s booster as ``train()`` (which trains ``model`` on ``xs``/``ys`` and returns its
    booster) would make it: loaded from the cache where an earlier run kept it, else trained and kept."""
    import xgboost as xgb

    where = cache_dir()
    path = None if where is None else where / f"prior-booster-{digest(model, xs, ys)}.ubj"
    if path is not None and path.is_file():
        try:
            booster = xgb.Booster(model_file=str(path))
            booster.set_param({"nthread": model.config.nthread})
            return booster
        except (xgb.core.XGBoostError, OSError, ValueError) as e:
            log.debug("prior booster cache %s unreadable (%s): training", path, e)
    booster = train()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".prior-booster-", suffix=".tmp.ubj")
            os.close(fd)
            try:
                booster.save_model(tmp)
                os.replace(tmp, path)  # whole or not at all: another run may read it meanwhile
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        except (OSError, xgb.core.XGBoostError) as e:
            log.debug("prior booster not kept in %s: %s", path.parent, e)
    return booster
