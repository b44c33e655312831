"""Where the sweep's cells run: in this process (:func:`run_local`) or on Ray (:func:`run_ray`: one task per
unit of cells, in workers that keep their model), and the ``model`` argument's source for workers."""
from __future__ import annotations

import os

from workbench.run.models import DEFAULT_MODEL_NAME, LoadedModel, load_model
from workbench.study.cells import run_unit, units

__all__ = ["model_source", "worker_model", "run_local", "run_ray", "RAY_START_ATTEMPTS"]


def model_source(model):
    """``(source for workers, model id)`` of the ``model`` argument."""

    if isinstance(model, LoadedModel):
        return (None if model.model_id == DEFAULT_MODEL_NAME else model.model_id), model.model_id
    if model is None:
        return None, DEFAULT_MODEL_NAME
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model), os.fspath(model)
    if callable(model):
        mid = getattr(model, "model_id", None)
        if not isinstance(mid, str):
            raise ValueError("model: a factory must carry a string attribute model_id (the sweep's model column)")
        return model, mid
    raise ValueError(f"model: must be a LoadedModel, None (the default model), a path or a factory, got {model!r}")


_WORKER_MODEL: dict = {}


def worker_model(source):
    """Load (once per process) the model a worker runs: ``None``/a path through ``load_model``, or a factory."""

    key = (getattr(source, "__module__", None), getattr(source, "__qualname__", None)) if callable(source) else source
    if key not in _WORKER_MODEL:
        _WORKER_MODEL.clear()  # one model per process
        _WORKER_MODEL[key] = source() if callable(source) else load_model(source, device="auto", progress=False)
    return _WORKER_MODEL[key]


def run_local(lm, model_source, todo, items, methods, emit, *, model_id, max_new_tokens, on_error):
    if lm is None:  # loaded for this sweep only (pass a LoadedModel to reuse one)

        lm = model_source() if callable(model_source) else load_model(model_source, device="auto", progress=False)
    for unit in units(todo, methods):
        rows, error = run_unit(lm, items[(unit[0].task, unit[0].item_id)], unit, methods[unit[0].method],
                                model_id=model_id, max_new_tokens=max_new_tokens, on_error=on_error)
        for row in rows:
            emit(row)
        if error is not None:
            raise error


def _ray_unit(model_source, item, unit, method, model_id, max_new_tokens, on_error):
    """A Ray task: one unit of cells (:func:`units`) in a worker that keeps its model between tasks;
    returns ``(rows, error)``."""
    return run_unit(worker_model(model_source), item, unit, method, model_id=model_id, max_new_tokens=max_new_tokens,
                     on_error=on_error)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError('executor="ray" needs Ray: pip install "attn-workbench[cluster]" (or pip install "ray>=2.9")') \
            from None
    return ray


RAY_START_ATTEMPTS = 3


def _ray_start(ray, address, kw) -> None:
    """``ray.init``; a new local instance is retried: on a busy machine its raylet can die waiting
    15 s for the dashboard agent to start (ray-project/ray#65983)."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kw)
            return
        except Exception:  # noqa: BLE001 - Ray raises a plain Exception on a startup timeout
            ray.shutdown()
            if address is not None or attempt == RAY_START_ATTEMPTS:
                raise


def run_ray(model_source, todo, items, methods, emit, *, model_id, max_new_tokens, on_error, ray_address, ray_init):
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kw = dict(ray_init or {})
        kw.setdefault("runtime_env", {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
        kw.setdefault("include_dashboard", False)
        kw.setdefault("log_to_driver", False)
        _ray_start(ray, ray_address, kw)
        started = True
    pending = {}
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        # max_calls=0: a worker keeps running cells (and keeps its model) even when it holds a GPU
        remote = ray.remote(num_cpus=1, num_gpus=1 if gpus >= 1 else 0, max_calls=0, max_retries=0)(_ray_unit)
        src_ref = ray.put(model_source)
        item_refs = {}
        for unit in units(todo, methods):
            k = (unit[0].task, unit[0].item_id)
            if k not in item_refs:
                item_refs[k] = ray.put(items[k])
            ref = remote.remote(src_ref, item_refs[k], unit, methods[unit[0].method], model_id, max_new_tokens,
                                on_error)
            pending[ref] = unit
        while pending:
            done, _ = ray.wait(list(pending), num_returns=min(len(pending), 64), timeout=1.0, fetch_local=True)
            for ref in done:
                pending.pop(ref)
                try:
                    rows, error = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
                    raise cause from None
                for row in rows:
                    emit(row)
                if error is not None:
                    raise error
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()
