"""The batch run on a Ray cluster, through Ray Data (`pip install "tflite-taichi[ray]"`).

Ray Data reads the inputs (`read_binary_files` for files; tables are read on the driver, which
adds each row's key, and handed over with `from_arrow`), `map_batches` runs `RayBatchWorker`, a
callable class, in a pool of `workers` actors each holding one Interpreter (the model's bytes
are put in the object store once and fetched by each actor), with `num_gpus` per actor from
--gpus-per-worker (a fraction lets several actors share a GPU; Ray sets CUDA_VISIBLE_DEVICES for
each actor, and the actor points Taichi's Vulkan device at the same GPU), and Ray Data's Parquet
writer writes what they return. An actor that dies is restarted by Ray and its batch retried
(`max_restarts`, `max_task_retries`): the dead actor's batch never returned, so its rows reach
the writer once.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import replace

from tflite_taichi.errors import BatchError
from tflite_taichi.batch.outputs import arrow_table, empty_arrow_table, write_error_part
from tflite_taichi.batch.runner import BatchRunner, RunConfig


def require_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise BatchError("--ray needs Ray Data: pip install 'tflite-taichi[ray]'") from None
    return ray


class RayBatchWorker:
    """One actor's interpreter; called with a pyarrow batch of rows, returns their outputs."""

    def __init__(self, model_ref: list, config: RunConfig):
        import ray
        gpus = ray.get_gpu_ids()
        if config.backend == "vulkan" and gpus:
            os.environ["TI_VISIBLE_DEVICE"] = str(int(gpus[0]))   # Ray sets CUDA_VISIBLE_DEVICES
        self.runner = BatchRunner(replace(config, model=ray.get(model_ref[0])))
        self.config = config

    def __call__(self, batch):
        columns = batch.column_names
        keys = batch.column("path").to_pylist()
        if "bytes" in columns:
            payloads = batch.column("bytes").to_pylist()
        else:
            rows = batch.to_pylist()
            payloads = [{k: v for k, v in row.items() if k != "path"} for row in rows]
        written, outputs, errors = self.runner.run(list(zip(keys, payloads)))
        write_error_part(self.config.out_dir, keys, errors)
        if not written:
            return empty_arrow_table(self.config.info)
        return arrow_table(written, outputs, self.config.info)


def ray_readable(items) -> tuple:
    """(items, [(key, reason)]): the items Ray Data's readers can take, and the rest. They take
    paths as UTF-8 text, so a file whose name is not (keyed with its bytes as \\xNN) cannot go
    through them: a row saying so, not a run that fails on it."""
    taken, refused = [], []
    for item in items:
        try:
            item.source.encode("utf-8")
            taken.append(item)
        except UnicodeEncodeError:
            refused.append((item.key, "its name is not UTF-8, which Ray Data's readers need "
                                      "(the local pool, without --ray, runs it)"))
    return taken, refused


def _datasets(ray, items, task_items: int) -> list:
    """Ray Datasets of the items, in blocks of about `task_items` rows (one block per read task:
    Ray hands blocks to actors, so one block for everything would keep all but one idle)."""
    files = [item.source for item in items if item.row is None]
    tables = sorted({item.source for item in items if item.row is not None})
    datasets = []
    if files:
        blocks = max(1, math.ceil(len(files) / task_items))
        datasets.append(ray.data.read_binary_files(files, include_paths=True,
                                                   override_num_blocks=blocks))
    if tables:
        import pyarrow as pa
        parts = []
        for path in tables:
            rows = [item.row for item in items if item.source == path]
            table = _read_table(path)
            keys = pa.array([f"{path}#{r}" for r in rows], pa.string())
            table = table.take(pa.array(rows))
            table = table.select([c for c in table.column_names if c != "path"])
            table = table.append_column("path", keys)
            parts += [table.slice(start, task_items) for start in range(0, len(rows), task_items)]
        datasets.append(ray.data.from_arrow(parts))
    return datasets


def _read_table(path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if path.lower().endswith(".parquet"):
        return pq.read_table(path)
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def _part_names(prefix: str):
    """Ray Data's writer names files {dataset_uuid}_{write uuid}_{task}.parquet: as PREFIX-ray,
    they are this run's parts (folder.py: --overwrite and read_outputs know them by prefix)."""
    from ray.data.datasource import FilenameProvider
    return FilenameProvider(dataset_uuid=f"{prefix}-ray", file_format="parquet")


def run_ray(items, config: RunConfig, *, address, workers, gpus_per_worker: float,
            cpus_per_worker: float, retries: int, task_items: int, progress: bool) -> dict:
    """Run `items` through Ray Data; returns {"workers": ..., "cluster": its CPUs and GPUs}.
    workers None: as many actors as the cluster's GPUs (or CPUs) hold at the per-actor share."""
    ray = require_ray()
    items, refused = ray_readable(items)
    write_error_part(config.out_dir, [key for key, _ in refused], refused)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = bool(progress)
        resources = ray.cluster_resources()
        if workers is None:
            share, have = (gpus_per_worker, resources.get("GPU", 0)) if gpus_per_worker \
                else (cpus_per_worker, resources.get("CPU", 1))
            workers = max(1, int(have // share)) if share else 1
        model_ref = ray.put(config.model)
        shipped = replace(config, model=b"")
        remote_args = {"max_restarts": -1, "max_task_retries": max(retries, 0)}
        if gpus_per_worker:
            remote_args["num_gpus"] = gpus_per_worker
        started = time.perf_counter()
        for ds in _datasets(ray, items, task_items):
            ds.map_batches(RayBatchWorker, fn_constructor_kwargs={"model_ref": [model_ref],
                                                                   "config": shipped},
                           batch_size=task_items, batch_format="pyarrow", concurrency=workers,
                           num_cpus=cpus_per_worker, **remote_args) \
              .write_parquet(config.out_dir, filename_provider=_part_names(config.part_prefix))
        return {"workers": [],       # Ray Data's actors: counted, not tracked one by one
                "ray": {"actors": workers, "gpus_per_actor": gpus_per_worker,
                        "cpus_per_actor": cpus_per_worker,
                        "cluster": {k: v for k, v in resources.items() if k in ("CPU", "GPU")},
                        "seconds": round(time.perf_counter() - started, 3)}}
    finally:
        if started_here:
            ray.shutdown()
