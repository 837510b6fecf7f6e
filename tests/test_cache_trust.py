"""Who the kernel cache trusts (cached modules are code this process runs). A cached module is native code (cpu) or GPU
code run in this process, so it is loaded only from a folder chain that no other user can change:
every parent of DIR owned by root or you and writable by nobody else (or sticky, like /tmp), DIR
and everything in it yours alone; checked on the descriptors actually read, at the moment of
loading. CI runs as root: a second user (uid 65534, nobody) is made with os.chown and, for the
attacker's own steps, a child process run as that user."""
import fcntl
import json
import os
import pathlib
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.runtime import cache
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.runtime.cache import CacheError

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 65534                    # nobody: the other local user
as_root = pytest.mark.skipif(not ROOT, reason="making a folder another user's needs root (CI is root)")

SHAPE = (1, 64)
TAICHI_BACKENDS = os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",")


def _one_op_model(op: str) -> bytes:
    """y = x (op) c: ADD and SUB give modules with the same kernel names and buffers, so the one
    loaded in place of the other runs, and gives the other's answers."""
    b = ModelBuilder(description=f"one {op}")
    g = b.subgraph()
    x = g.input("x", SHAPE)
    y = g.tensor("y", SHAPE)
    g.op(op, [x, g.const("c", np.linspace(1, 2, SHAPE[1], dtype=np.float32).reshape(SHAPE))], [y])
    g.output(y)
    return b.finish()


# -- the folder chain, checked in this process (no Taichi) -----------------------------------
def test_a_parent_that_others_can_write_is_refused(tmp_path):
    """A group-writable parent (a shared project folder) lets its group replace DIR."""
    parent = tmp_path / "project"
    parent.mkdir()
    os.chmod(parent, 0o775)
    with pytest.raises(CacheError, match=r"parent folder .*project is group- or world-writable"):
        cache.prepare_dir(parent / "cache")
    assert not (parent / "cache").exists()            # refused before anything was made


def test_a_sticky_parent_like_tmp_is_accepted(tmp_path):
    """Others may add their own entries to a sticky folder but cannot rename or remove yours."""
    parent = tmp_path / "sticky"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    root = cache.prepare_dir(parent / "cache")
    assert os.path.isdir(os.path.join(root, cache.MODULES))


@as_root
def test_a_parent_another_user_owns_is_refused(tmp_path):
    """The owner of a parent could rename DIR away and put their own in its place, whatever the
    parent's mode: refused, however deep (a parent pre-created in /tmp, another user's HOME)."""
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    (parent / "deeper").mkdir(mode=0o700)
    os.chown(parent, OTHER_UID, OTHER_UID)
    for cache_dir in (parent / "cache", parent / "deeper" / "cache"):
        with pytest.raises(CacheError, match=rf"parent folder .*theirs is owned by uid {OTHER_UID}"):
            cache.prepare_dir(cache_dir)


@as_root
def test_a_symbolic_link_another_user_owns_is_not_followed(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheError, match=rf"symbolic link owned by uid {OTHER_UID}"):
        cache.prepare_dir(link / "cache")
    os.lchown(link, 0, 0)                                 # yours (root's): followed
    assert cache.prepare_dir(link / "cache") == str(target / "cache")


def test_missing_parents_are_made_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        root = cache.prepare_dir(tmp_path / "a" / "b" / "cache")
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", root, os.path.join(root, "taichi")):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder


def test_a_module_someone_else_could_write_is_not_loaded(tmp_path):
    """Checked on the descriptor that is read: a module folder or file that is not yours alone
    is rebuilt, with a CacheWarning saying why."""
    store = cache.ModuleStore(cache.prepare_dir(tmp_path / "cache"))
    key = "e" * 64
    with store.building() as folder:
        with open(os.path.join(folder, "module.tcm"), "wb") as f:
            f.write(b"kernels")
        store.commit(key, folder, "module.tcm", "vulkan", {})
    assert store.check(key, "vulkan") is None
    os.chmod(os.path.join(store.path(key), "module.tcm"), 0o646)
    assert "module.tcm is group- or world-writable" in store.check(key, "vulkan")
    os.chmod(os.path.join(store.path(key), "module.tcm"), 0o600)
    os.chmod(store.path(key), 0o770)
    assert "cached module" in store.check(key, "vulkan") and "writable" in store.check(key, "vulkan")
    os.chmod(store.path(key), 0o700)
    os.mkfifo(os.path.join(store.path(key), "fifo"))   # read with O_NONBLOCK: no hang
    assert store.check(key, "vulkan") == "fifo is not a regular file"


def test_the_cache_is_checked_again_for_each_interpreter(tmp_path):
    """Not once per process: a folder loosened after the first interpreter refuses the next."""
    model = tmp_path / "m.tflite"
    model.write_bytes(_one_op_model("ADD"))
    root = tmp_path / "cache"
    assert cache.root_for(str(root)) == str(root)
    os.chmod(root, 0o777)
    with pytest.raises(CacheError, match="writable"):
        Interpreter(model_path=str(model), backend="cpu", cache_dir=str(root))


def _commit(store, key: str, data: bytes = b"kernels") -> None:
    """A one-file module (what a gfx arch caches) committed under `key`."""
    with store.building() as folder:
        with open(os.path.join(folder, "module.tcm"), "wb") as f:
            f.write(data)
        store.commit(key, folder, "module.tcm", "vulkan", {})


def _lock_held(root: str) -> str:
    """What another holder has of DIR/lock right now, seen from a new open file description
    (flock conflicts between those even in one process): 'exclusive', 'shared' or 'free'."""
    fd = os.open(os.path.join(root, cache.LOCK), os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "exclusive"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "shared"
        return "free"
    finally:
        os.close(fd)


def test_eviction_waits_while_a_module_is_being_loaded(tmp_path, monkeypatch):
    """A module is checked and loaded under a shared lock; removing, replacing and evicting take
    it whole. Before, another process's eviction between the check and the load made the C API
    read a half-removed folder (a segfault on cpu). The evictor's request for the lock is seen
    being refused (no sleep: the test does not depend on how fast its thread starts)."""
    monkeypatch.setenv("TFLITE_TAICHI_CACHE_MAX_MB", "0")          # every other module goes
    monkeypatch.setattr(cache, "EVICT_EVERY", 1)
    store = cache.ModuleStore(cache.prepare_dir(tmp_path / "cache"))
    loading, other = "a" * 64, "b" * 64
    _commit(store, loading, bytes(1000))
    asked = queue.Queue()           # what the evictor's tries at the lock met
    loader = threading.current_thread()

    def flock(fd, operation):
        if threading.current_thread() is not loader:
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
                asked.put("granted")
                return
            except BlockingIOError:
                asked.put("refused")
        fcntl.flock(fd, operation)
    monkeypatch.setattr(cache, "fcntl", types.SimpleNamespace(
        flock=flock, LOCK_SH=fcntl.LOCK_SH, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB))
    evicted = threading.Event()
    with store.opened(loading, "vulkan") as (found, problem):
        assert problem is None and found.data == bytes(1000)
        evictor = threading.Thread(target=lambda: (_commit(store, other), evicted.set()))
        evictor.start()
        assert asked.get(timeout=120) == "refused"     # it waits for the load to finish
        assert not evicted.is_set()
        assert os.path.isfile(os.path.join(store.path(loading), "module.tcm"))
    evictor.join(120)
    assert evicted.is_set() and not os.path.exists(store.path(loading))


def test_eviction_removes_modules_only_under_the_exclusive_lock(tmp_path, monkeypatch):
    """Every folder eviction removes (least recently used modules, a crashed build's temporary
    folder) goes while DIR/lock is held exclusively: no process is loading it meanwhile (they
    hold the lock shared) and no other process is evicting or committing."""
    monkeypatch.setenv("TFLITE_TAICHI_CACHE_MAX_MB", "0")          # every other module goes
    monkeypatch.setattr(cache, "EVICT_EVERY", 1)
    root = cache.prepare_dir(tmp_path / "cache")
    store = cache.ModuleStore(root)
    old, new = "a" * 64, "b" * 64
    _commit(store, old, bytes(1000))
    crashed = os.path.join(store.modules, ".tmp-" + "0" * 32)
    os.mkdir(crashed, 0o700)
    long_ago = time.time() - cache.STALE_TEMP_S - 5
    os.utime(crashed, (long_ago, long_ago))
    seen = {}
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        seen[os.path.basename(path)] = _lock_held(root)
        return real_rmtree(path, *args, **kwargs)
    monkeypatch.setattr(cache.shutil, "rmtree", rmtree)
    _commit(store, new, bytes(1000))
    assert not os.path.exists(store.path(old)) and not os.path.exists(crashed)
    assert os.path.isdir(store.path(new))
    assert {name: seen.get(name) for name in (old, os.path.basename(crashed))} == {
        old: "exclusive", os.path.basename(crashed): "exclusive"}, seen


def _meta_made_untrusted(tmp_path, change) -> tuple:
    """A sound module whose meta.json `change(path)` then makes untrusted: (store, key, path)."""
    store = cache.ModuleStore(cache.prepare_dir(tmp_path / "cache"))
    key = "c" * 64
    _commit(store, key)
    assert store.check(key, "vulkan") is None                       # sound before the change
    meta = os.path.join(store.path(key), cache.META)
    change(meta)
    return store, key, meta


def _refused_and_removed(store, key: str, meta: str, says: str) -> None:
    """The module is not loaded: a CacheWarning naming meta.json and why, and it is removed
    (it is built again), as for any other file of the module that is not yours alone."""
    problem = store.check(key, "vulkan")
    assert problem is not None and says in problem and meta in problem, problem
    with pytest.warns(cache.CacheWarning, match="are not used") as caught:
        with store.opened(key, "vulkan") as (found, problem):
            assert found is None and says in problem and meta in problem
    assert says in str(caught[0].message)
    assert not os.path.lexists(store.path(key))


@pytest.mark.parametrize("mode", [0o620, 0o602], ids=["group-writable", "world-writable"])
def test_a_meta_json_others_could_write_is_not_trusted(tmp_path, mode):
    """meta.json holds the hashes the module's files are checked against: whoever can write it
    can re-sign a module of theirs, so it is checked like every other file in the folder."""
    store, key, meta = _meta_made_untrusted(tmp_path, lambda path: os.chmod(path, mode))
    _refused_and_removed(store, key, meta, f"group- or world-writable (mode {mode:04o})")


@as_root
def test_a_meta_json_another_user_owns_is_not_trusted(tmp_path):
    store, key, meta = _meta_made_untrusted(
        tmp_path, lambda path: os.chown(path, OTHER_UID, OTHER_UID))
    assert os.stat(meta).st_mode & 0o777 == 0o600                    # only its owner changed
    _refused_and_removed(store, key, meta, f"owned by uid {OTHER_UID}")


# -- the attacks, end to end (a Taichi process each) -------------------------------------------
VICTIM = r'''
import json, os, shutil, subprocess, sys
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter
from tflite_taichi.runtime import device
it = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"])
if args["attack"] == "parent":
    # the parent becomes another user's while the victim runs; that user swaps the cache folder
    os.chown(args["parent"], 65534, 65534)
    os.chmod(args["parent"], 0o755)
    swap = 'mv "$1" "$1.victim" && cp -R "$2" "$1"'     # sh: this Python is root's alone
    subprocess.run(["sh", "-c", swap, "sh", args["cache_dir"], args["planted"]],
                   user=65534, group=65534, check=True)
elif args["attack"] == "between":
    # after the module was checked and before it is loaded, modules/KEY is replaced
    real = device.CapiDevice.load_module
    def swapping(self, path, data=None):
        modules = os.path.join(args["cache_dir"], "modules")
        key = os.path.join(modules, args["key"])
        if not os.path.exists(key + "-moved"):
            os.rename(key, key + "-moved")
            shutil.copytree(args["planted"], key)
        return real(self, path, data)
    device.CapiDevice.load_module = swapping
try:
    it.allocate_tensors()
except Exception as e:
    print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
    sys.exit(0)
x = np.load(args["input"])
it.set_tensor(it.get_input_details()[0]["index"], x)
it.invoke()
y = it.get_tensor(it.get_output_details()[0]["index"])
print("RESULT " + json.dumps({"y": y.tolist(), "state": it.summary()["cache"]["state"], "why": it.summary()["cache"]["reason"]}), flush=True)
'''


def _run(args: dict, cwd) -> dict:
    env = dict(os.environ, ENABLE_TAICHI_HEADER_PRINT="False")
    proc = subprocess.run([sys.executable, "-c", VICTIM, json.dumps(args)], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


class Models:
    """ADD's module cached in `victim`, SUB's in `other`, and SUB's module re-signed under ADD's
    key (`planted`): what an attacker who can write the folder would put there."""

    def __init__(self, tmp, backend: str, victim_parent=None):
        self.tmp, self.backend = tmp, backend
        for op in ("ADD", "SUB"):
            (tmp / f"{op}.tflite").write_bytes(_one_op_model(op))
        self.x = np.random.default_rng(0).uniform(-1, 1, SHAPE).astype(np.float32)
        self.input = str(tmp / "x.npy")
        np.save(self.input, self.x)
        c = np.linspace(1, 2, SHAPE[1], dtype=np.float32).reshape(SHAPE)
        self.add, self.sub = self.x + c, self.x - c
        self.victim = self.cached("ADD", (victim_parent or tmp / "victim-parent") / "cache")
        other = self.cached("SUB", tmp / "other")
        [self.key] = self.keys(self.victim)
        [other_key] = self.keys(other)
        self.planted_module = tmp / "planted-module"
        shutil.copytree(other / cache.MODULES / other_key, self.planted_module)
        meta_path = self.planted_module / cache.META
        meta = json.loads(meta_path.read_text())
        meta["key"] = self.key                                   # re-signed: hashes still match
        meta_path.write_text(json.dumps(meta))

    @staticmethod
    def keys(root):
        return [p.name for p in (root / cache.MODULES).iterdir() if not p.name.startswith(".")]

    def cached(self, op, root):
        out = self.run(op, root, "none")
        assert out.get("state") == "cold", out
        return root

    def run(self, op, root, attack, **extra):
        return _run({"model": str(self.tmp / f"{op}.tflite"), "backend": self.backend,
                     "cache_dir": str(root), "input": self.input, "attack": attack, **extra},
                    self.tmp)


@pytest.mark.parametrize("backend", [b for b in ("cpu", "vulkan") if b in TAICHI_BACKENDS])
def test_a_module_replaced_between_check_and_load_is_not_what_runs(tmp_path, backend):
    """The module loaded is the one whose files were checked: read through the checked folder's
    descriptor (cpu: a /proc/self/fd path; vulkan: the very bytes hashed). Before, the path was
    opened again by name, and the replacement's kernels (SUB's) ran in ADD's place."""
    models = Models(tmp_path, backend)
    out = models.run("ADD", models.victim, "between", key=models.key,
                     planted=str(models.planted_module))
    assert "error" not in out, out
    assert (models.victim / cache.MODULES / (models.key + "-moved")).is_dir()   # it was swapped
    assert out["state"] == "warm", out
    np.testing.assert_array_equal(np.array(out["y"], np.float32), models.add)


@as_root
@pytest.mark.skipif("cpu" not in TAICHI_BACKENDS, reason="cpu not in TFLITE_TAICHI_TEST_BACKENDS")
def test_a_parents_owner_cannot_swap_the_cache_under_a_running_process(tmp_path):
    """The issue's attack: the parent of cache_dir becomes another user's while the victim runs
    (checked once per process before); that user renames the cache away and puts one holding
    their own cpu module, re-signed, in its place. Now the chain is checked again at the load:
    refused, nothing of theirs runs."""
    # in /tmp itself: the other user must reach the parent (pytest's tmp_path is root's alone)
    parent = pathlib.Path(tempfile.mkdtemp(prefix="tflite-taichi-victim-"))
    planted = tempfile.mkdtemp(prefix="tflite-taichi-planted-")
    try:
        os.chmod(parent, 0o755)
        models = Models(tmp_path, "cpu", victim_parent=parent)
        os.chmod(planted, 0o755)
        planted_cache = os.path.join(planted, "cache")
        shutil.copytree(models.victim, planted_cache)
        shutil.rmtree(os.path.join(planted_cache, cache.MODULES, models.key))
        shutil.copytree(models.planted_module, os.path.join(planted_cache, cache.MODULES, models.key))
        for dirpath, dirnames, filenames in os.walk(planted):
            for name in dirnames + filenames + [""]:
                os.chown(os.path.join(dirpath, name), OTHER_UID, OTHER_UID)
        # the control: with no attack, ADD runs warm from this cache
        assert models.run("ADD", models.victim, "none")["state"] == "warm"
        out = models.run("ADD", models.victim, "parent", parent=str(models.victim.parent),
                         planted=planted_cache)
        assert "y" not in out, f"the planted module ran: {out}"
        assert out["error"].startswith("CacheError") and f"owned by uid {OTHER_UID}" in out["error"], out
    finally:
        shutil.rmtree(planted, ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)
