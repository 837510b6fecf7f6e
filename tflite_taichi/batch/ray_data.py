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

A Ray cluster that a run starts itself is started from a private empty folder, under umask 077
(`_private_start`): Ray puts the driver's current folder first on every worker's sys.path and
its processes inherit the folder and umask they were started with, so a `numpy.py` that someone
else left where the user runs from would run in every worker, and Ray Data's writer would make
group-writable part files under a umask of 002, which a later --resume refuses to trust. Every
path the workers are handed is therefore absolute, and so are the entries of PYTHONPATH that a
cluster started here inherits. A cluster that was already running keeps its own umask, and one
the user's program joined itself (ray.init before the run) its own folder too (docs/batch.md).
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Optional

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

    def __init__(self, model_ref: list, config: RunConfig, relative_to: str = ""):
        """relative_to: the folder the items' relative paths were given from, which Ray reads
        as absolute paths: their keys are the paths as given, without it."""
        import ray
        gpus = ray.get_gpu_ids()
        if config.backend == "vulkan" and gpus:
            os.environ["TI_VISIBLE_DEVICE"] = str(int(gpus[0]))   # Ray sets CUDA_VISIBLE_DEVICES
        self.runner = BatchRunner(replace(config, model=ray.get(model_ref[0])))
        self.config = config
        self.relative_to = relative_to

    def _key(self, path: str) -> str:
        if self.relative_to and path.startswith(self.relative_to):
            return path[len(self.relative_to):]
        return path

    def __call__(self, batch):
        columns = batch.column_names
        keys = [self._key(path) for path in batch.column("path").to_pylist()]
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


def _datasets(ray, items, task_items: int, cwd: str) -> list:
    """[(Ray Dataset, the folder its relative paths were given from or "")] of the items, in
    blocks of about `task_items` rows (one block per read task: Ray hands blocks to actors, so
    one block for everything would keep all but one idle). Files given by relative paths are
    read as absolute ones from `cwd` (Ray's workers run elsewhere), in a Dataset of their own:
    an absolute path given as such may name the same file, and keeps its own key."""
    relative_to = os.path.join(cwd, "")
    files = [item.source for item in items if item.row is None]
    tables = sorted({item.source for item in items if item.row is not None})
    datasets = []
    for paths, prefix in (([p for p in files if os.path.isabs(p)], ""),
                          ([relative_to + p for p in files if not os.path.isabs(p)], relative_to)):
        if paths:
            blocks = max(1, math.ceil(len(paths) / task_items))
            datasets.append((ray.data.read_binary_files(paths, include_paths=True,
                                                        override_num_blocks=blocks), prefix))
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
        datasets.append((ray.data.from_arrow(parts), ""))
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


def _absolute_pythonpath() -> Optional[str]:
    """PYTHONPATH with each entry absolute, as Python made it for this process, for processes
    that run in another folder: an empty entry among others is the current folder (the user
    asked for it), an empty PYTHONPATH is none. None: PYTHONPATH is not set."""
    given = os.environ.get("PYTHONPATH")
    if not given:
        return given
    return os.pathsep.join(os.path.abspath(entry) for entry in given.split(os.pathsep))


def _absolute_cache_dir(cache_dir: Optional[str], cwd: str) -> Optional[str]:
    """The kernel cache folder for the actors: the one given, or the default where it is a
    relative path (from $TFLITE_TAICHI_CACHE_DIR), from `cwd`; None: each node's default."""
    from tflite_taichi.runtime.cache import default_dir
    given = cache_dir if cache_dir is not None else default_dir()
    given = os.path.expanduser(os.fspath(given))
    if cache_dir is None and os.path.isabs(given):
        return None
    return os.path.join(cwd, given)


def _private_folder() -> str:
    """A new empty folder only we can use (mkdtemp makes it 0700), to start Ray from."""
    try:
        return tempfile.mkdtemp(prefix="tflite-taichi-ray-")
    except OSError as e:
        raise BatchError(f"--ray: cannot make a private folder to start Ray from in "
                         f"{tempfile.gettempdir()} ({e.strerror or e}); set TMPDIR to a folder "
                         "you can write") from None


@contextlib.contextmanager
def _private_start(folder: str, cwd: str):
    """While Ray starts: this process in `folder` (private and empty), its umask 077 and
    PYTHONPATH's entries absolute, which the cluster's processes inherit (the raylet, and from
    it every worker). Ray adds the current folder to every worker's sys.path (a working_dir in
    runtime_env would stop that too, but Ray packs and unpacks it for every job); 077 makes
    Ray Data's part files 0600 from the start, where a chmod after writing would leave them
    open to another user for a moment. All restored once ray.init returns (they are the
    process's: a thread of the caller's that runs meanwhile sees them too)."""
    umask = os.umask(0o077)
    pythonpath = os.environ.get("PYTHONPATH")
    absolute = _absolute_pythonpath()
    try:
        if absolute is not None:
            os.environ["PYTHONPATH"] = absolute
        os.chdir(folder)
        yield
    finally:
        os.chdir(cwd)
        os.umask(umask)
        if pythonpath is not None:
            os.environ["PYTHONPATH"] = pythonpath


def run_ray(items, config: RunConfig, *, address, workers, gpus_per_worker: float,
            cpus_per_worker: float, retries: int, task_items: int, progress: bool) -> dict:
    """Run `items` through Ray Data; returns {"workers": ..., "cluster": its CPUs and GPUs}.
    workers None: as many actors as the cluster's GPUs (or CPUs) hold at the per-actor share."""
    ray = require_ray()
    items, refused = ray_readable(items)
    write_error_part(config.out_dir, [key for key, _ in refused], refused)
    cwd = os.getcwd()
    started_here = not ray.is_initialized()
    private = _private_folder() if started_here else None
    try:
        if started_here:
            with _private_start(private, cwd):
                ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        return _run_datasets(ray, items, config, cwd=cwd, workers=workers,
                             gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                             retries=retries, task_items=task_items, progress=progress)
    finally:
        if started_here:
            ray.shutdown()
            shutil.rmtree(private, ignore_errors=True)


def _run_datasets(ray, items, config: RunConfig, *, cwd, workers, gpus_per_worker: float,
                  cpus_per_worker: float, retries: int, task_items: int, progress: bool) -> dict:
    """The items' Datasets through `workers` actors of RayBatchWorker into Parquet parts; paths
    handed to the workers are absolute (from `cwd`): they run in another folder."""
    ray.data.DataContext.get_current().enable_progress_bars = bool(progress)
    resources = ray.cluster_resources()
    if workers is None:
        share, have = (gpus_per_worker, resources.get("GPU", 0)) if gpus_per_worker \
            else (cpus_per_worker, resources.get("CPU", 1))
        workers = max(1, int(have // share)) if share else 1
    model_ref = ray.put(config.model)
    shipped = replace(config, model=b"", out_dir=os.path.join(cwd, config.out_dir),
                      cache_dir=_absolute_cache_dir(config.cache_dir, cwd))
    remote_args = {"max_restarts": -1, "max_task_retries": max(retries, 0)}
    if gpus_per_worker:
        remote_args["num_gpus"] = gpus_per_worker
    started = time.perf_counter()
    for ds, relative_to in _datasets(ray, items, task_items, cwd):
        ds.map_batches(RayBatchWorker, fn_constructor_kwargs={"model_ref": [model_ref],
                                                               "config": shipped,
                                                               "relative_to": relative_to},
                       batch_size=task_items, batch_format="pyarrow", concurrency=workers,
                       num_cpus=cpus_per_worker, **remote_args) \
          .write_parquet(shipped.out_dir, filename_provider=_part_names(config.part_prefix))
    return {"workers": [],       # Ray Data's actors: counted, not tracked one by one
            "ray": {"actors": workers, "gpus_per_actor": gpus_per_worker,
                    "cpus_per_actor": cpus_per_worker,
                    "cluster": {k: v for k, v in resources.items() if k in ("CPU", "GPU")},
                    "seconds": round(time.perf_counter() - started, 3)}}
