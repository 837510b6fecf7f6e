"""cache_dir / model_token (tflite_taichi.cache): issue #5's serialization with issue #7's
robustness. Every Taichi run is its own subprocess: Taichi is one arch per process, and the
cache is written when the process exits."""
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from tflite_taichi import Interpreter, cache
from tflite_taichi.demo import build_demo_model

TAICHI_BACKENDS = os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",")

RUN = r'''
import json, sys, warnings
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter
from tflite_taichi.cache import CacheError, CacheWarning
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"],
                     model_token=args.get("token"))
    it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.load(args["input"]))
it.invoke()
np.save(args["output"], it.get_tensor(it.get_output_details()[0]["index"]))
result = {"info": it._cache.info(),
          "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]}
if args.get("other_dir"):          # one cache_dir per process: another is refused, the same is fine
    try:
        Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["other_dir"])
    except CacheError as e:
        result["other_dir"] = str(e)
    again = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"])
    result["same_dir"] = again._cache.info()["token"]
    reused = Interpreter(model_path=args["other_model"], backend=args["backend"],   # a token names
                         cache_dir=args["cache_dir"], model_token=result["same_dir"])  # a record only
    result["reused_token"] = reused._cache.info()
if args.get("rebuilt_meanwhile"):    # as if another process had wiped and rebuilt the cache
    import os
    path = os.path.join(args["cache_dir"], "manifest.json")
    manifest = json.load(open(path))
    manifest["generation"] = "0" * 32
    json.dump(manifest, open(path, "w"))
print("RESULT " + json.dumps(result), flush=True)
if args.get("hang"):                 # for a test that kills the process before it exits
    import time
    time.sleep(600)
'''

REFUSE = r'''
import json, os, sys
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter, backend
from tflite_taichi.errors import BackendUnavailable, InputError
out = {}
for name, kwargs in args["cases"]:
    try:
        Interpreter(model_path=args["model"], backend="cpu", **kwargs)
        out[name] = "accepted"
    except (BackendUnavailable, InputError) as e:
        out[name] = f"{type(e).__name__}: {e}"
out["taichi_started"] = backend.current()
print("RESULT " + json.dumps(out), flush=True)
'''


def _env():
    env = dict(os.environ, ENABLE_TAICHI_HEADER_PRINT="False", PYTHONUNBUFFERED="1")
    for var in ("TI_OFFLINE_CACHE_FILE_PATH", *cache.DRIVER_ENV):
        env.pop(var, None)           # the cache must not need them
    return env


def _spawn(script, args, cwd):
    return subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _result(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-3000:]
    assert "could not record the kernel cache" not in out, out[-3000:]
    return dict(json.loads(lines[-1][len("RESULT "):]), log=out)


class Setup:
    def __init__(self, tmp):
        self.tmp = tmp
        self.model = str(tmp / "demo.tflite")
        with open(self.model, "wb") as f:
            f.write(build_demo_model())
        it = Interpreter(model_path=self.model, backend="reference")
        it.allocate_tensors()
        detail = it.get_input_details()[0]
        x = np.random.default_rng(7).uniform(-1, 1, detail["shape"]).astype(np.float32)
        self.input = str(tmp / "x.npy")
        np.save(self.input, x)
        it.set_tensor(detail["index"], x)
        it.invoke()
        self.expected = it.get_tensor(it.get_output_details()[0]["index"])
        self.runs = 0

    def start(self, cache_dir, backend="cpu", **extra):
        self.runs += 1
        output = str(self.tmp / f"out{self.runs}.npy")
        args = {"model": self.model, "input": self.input, "output": output, "backend": backend,
                "cache_dir": str(cache_dir), **extra}
        return _spawn(RUN, args, self.tmp), output

    def run(self, cache_dir, backend="cpu", **extra):
        proc, output = self.start(cache_dir, backend, **extra)
        result = _result(proc)
        result["y"] = np.load(output)
        np.testing.assert_allclose(result["y"], self.expected, rtol=1e-5, atol=1e-6)
        return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def warm(setup):
    """A cache built by one process (cold) and used by a second (warm), on cpu."""
    root = setup.tmp / "new" / "cache"           # neither exists yet
    cold = setup.run(root)
    other_model = setup.tmp / "other.tflite"
    other_model.write_bytes(build_demo_model(seed=1))
    warm = setup.run(root, other_dir=str(setup.tmp / "other"), other_model=str(other_model))
    return root, cold, warm


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cold_then_warm_same_outputs(warm, setup):
    root, cold, hot = warm
    assert cold["info"]["state"] == "cold" and "never built" in cold["info"]["reason"]
    assert hot["info"]["state"] == "warm", hot["info"]
    assert not cold["warnings"] and not hot["warnings"]
    np.testing.assert_array_equal(cold["y"], hot["y"])
    covers = cache.token_covers(setup.model, "cpu", "fp32")
    assert cold["info"]["token"] == hot["info"]["token"] == cache.default_token(covers)
    assert cold["info"]["token_source"] == "fingerprint"


def test_cache_dir_is_private_and_consistent(warm):
    root = warm[0]
    assert _mode(root) == 0o700
    for sub in cache.SUBDIRS:
        assert _mode(root / sub) == 0o700, sub
    assert _mode(root / cache.MANIFEST) == 0o600
    records = list((root / cache.MODELS).iterdir())
    assert len(records) == 1 and _mode(records[0]) == 0o600
    manifest, problem = cache.check(str(root))
    assert problem is None
    assert any(f.startswith("taichi/") and f.endswith(".tic") for f in manifest["files"])
    assert not [p for p in root.rglob(".tmp-*")]           # atomic writes leave no temp files


def test_one_cache_dir_per_process(warm):
    hot = warm[2]
    assert "already uses the cache in" in hot["other_dir"]
    assert hot["same_dir"] == hot["info"]["token"]


def test_a_token_reused_for_another_model_is_cold(warm):
    """Taichi keys kernels by their IR: a token only names a record, and the record says what
    it covers, so another model under the same token starts cold and is told why."""
    reused = warm[2]["reused_token"]
    assert reused["state"] == "cold" and reused["token_source"] == "given"
    assert "recorded for something else" in reused["reason"] and "model_sha256" in reused["reason"]


def test_unsafe_cache_dirs_and_tokens_are_refused(setup):
    tmp = setup.tmp / "refuse"
    tmp.mkdir()
    for name, mode in (("world", 0o777), ("group", 0o770)):
        (tmp / name).mkdir()
        os.chmod(tmp / name, mode)
    (tmp / "file").write_text("not a folder")
    cases = [("world", {"cache_dir": str(tmp / "world")}),
             ("group", {"cache_dir": str(tmp / "group")}),
             ("file", {"cache_dir": str(tmp / "file")}),
             ("token_up", {"cache_dir": str(tmp / "ok"), "model_token": "../evil"}),
             ("token_slash", {"cache_dir": str(tmp / "ok"), "model_token": "a/b"}),
             ("token_dot", {"cache_dir": str(tmp / "ok"), "model_token": ".hidden"}),
             ("token_long", {"cache_dir": str(tmp / "ok"), "model_token": "x" * 129}),
             ("token_etc", {"cache_dir": str(tmp / "ok"), "model_token": "../../etc"}),
             ("token_abs", {"cache_dir": str(tmp / "ok"), "model_token": "/etc/passwd"}),
             ("token_dotdot", {"cache_dir": str(tmp / "ok"), "model_token": ".."}),
             ("token_nul", {"cache_dir": str(tmp / "ok"), "model_token": "a\x00b"}),
             ("token_backslash", {"cache_dir": str(tmp / "ok"), "model_token": "..\\x"}),
             ("token_unicode", {"cache_dir": str(tmp / "ok"), "model_token": "mod\u00e8le"}),
             ("token_empty", {"cache_dir": str(tmp / "ok"), "model_token": ""}),
             ("token_not_str", {"cache_dir": str(tmp / "ok"), "model_token": 7}),
             ("token_no_dir", {"model_token": "fine"})]
    if hasattr(os, "geteuid") and os.geteuid() == 0:      # root can make a folder someone else's
        (tmp / "theirs").mkdir(mode=0o700)
        os.chown(tmp / "theirs", 65534, 65534)
        cases.append(("theirs", {"cache_dir": str(tmp / "theirs")}))
    out = _result(_spawn(REFUSE, {"model": setup.model, "cases": cases}, tmp))
    assert out["taichi_started"] is None, out       # refused before Taichi starts
    for name in ("world", "group"):
        assert out[name].startswith("CacheError") and "writable" in out[name], out[name]
        assert os.listdir(tmp / name) == []        # nothing written into it
    assert out["file"].startswith("CacheError") and "not a directory" in out["file"]
    if "theirs" in out:
        assert out["theirs"].startswith("CacheError") and "owned by uid 65534" in out["theirs"]
    for name in ("token_up", "token_slash", "token_dot", "token_long", "token_etc", "token_abs",
                 "token_dotdot", "token_nul", "token_backslash", "token_unicode", "token_empty",
                 "token_not_str"):
        assert out[name].startswith("InputError") and "model_token" in out[name], out[name]
    assert out["token_no_dir"].startswith("InputError") and "needs cache_dir" in out["token_no_dir"]
    assert not (tmp / "ok").exists() and not (setup.tmp / "evil").exists()


def _largest_tic(root):
    return max((root / "taichi").glob("*.tic"), key=lambda p: p.stat().st_size)


def _truncate(root):
    path = _largest_tic(root)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _bitflip(root):
    path = _largest_tic(root)
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x08
    path.write_bytes(bytes(data))


def _foreign_version(root):
    manifest = json.loads((root / cache.MANIFEST).read_text())
    manifest["versions"]["taichi"] = "1.6.0"
    (root / cache.MANIFEST).write_text(json.dumps(manifest))


def _unlisted_file(root):
    path = _largest_tic(root)
    shutil.copy(path, path.with_name("T" + "0" * 64 + ".tic"))


def _garbage_manifest(root):
    (root / cache.MANIFEST).write_bytes(b'{"format": 1, "files": {"taichi/')


def _planted_symlink(root):
    os.symlink("/etc/passwd", root / "taichi" / ("T" + "1" * 64 + ".tic"))


@pytest.mark.parametrize("damage, says", [
    (_truncate, "truncated"), (_bitflip, "sha256 (corrupt)"),
    (_foreign_version, "taichi '1.6.0' != '1.7.4'"), (_unlisted_file, "is not in manifest.json"),
    (_garbage_manifest, "manifest.json is unreadable"), (_planted_symlink, "is not a regular file"),
], ids=["truncated", "bitflip", "foreign-version", "unlisted-file", "garbage-manifest", "symlink"])
def test_damaged_cache_is_detected_and_rebuilt(warm, setup, damage, says):
    root = setup.tmp / f"damaged-{damage.__name__}"
    shutil.copytree(warm[0], root)
    generation = json.loads((root / cache.MANIFEST).read_text())["generation"]
    damage(root)
    result = setup.run(root)
    assert len(result["warnings"]) == 1 and "not trusted" in result["warnings"][0], result["warnings"]
    assert says in result["warnings"][0], result["warnings"][0]
    assert result["info"]["state"] == "cold" and result["info"]["rebuilt"], result["info"]
    np.testing.assert_array_equal(result["y"], warm[1]["y"])
    manifest, problem = cache.check(str(root))                  # rebuilt, consistent again
    assert problem is None and manifest["generation"] != generation
    assert any(f.endswith(".tic") for f in manifest["files"])


def test_a_cache_rebuilt_while_a_process_ran_is_not_extended(warm, setup):
    """Taichi's dump would list kernels whose files the rebuild removed: the exit clears it."""
    root = setup.tmp / "rebuilt-meanwhile"
    shutil.copytree(warm[0], root)
    result = setup.run(root, rebuilt_meanwhile=True)
    assert result["info"]["state"] == "warm" and "another process rebuilt it" in result["log"]
    manifest, problem = cache.check(str(root))
    assert problem is None and manifest["files"] == {}
    for record in (root / cache.MODELS).iterdir():          # the next start of the model is cold
        assert json.loads(record.read_text())["generation"] != manifest["generation"]


def test_two_processes_at_once_share_a_cache(setup):
    root = setup.tmp / "shared"
    started = [setup.start(root) for _ in range(2)]
    for proc, output in started:
        result = _result(proc)
        assert not result["warnings"], result["warnings"]
        np.testing.assert_allclose(np.load(output), setup.expected, rtol=1e-5, atol=1e-6)
    manifest, problem = cache.check(str(root))
    assert problem is None and any(f.endswith(".tic") for f in manifest["files"])


@pytest.mark.skipif("vulkan" not in TAICHI_BACKENDS, reason="vulkan not in TFLITE_TAICHI_TEST_BACKENDS")
def test_vulkan_cold_then_warm_with_a_given_token(setup):
    """lavapipe on CI: Mesa's shader cache and Taichi's Vulkan pipeline cache land in DIR too."""
    root = setup.tmp / "vulkan"
    cold = setup.run(root, backend="vulkan", token="demo-v1")
    hot = setup.run(root, backend="vulkan", token="demo-v1")
    assert (cold["info"]["state"], hot["info"]["state"]) == ("cold", "warm"), hot["info"]
    assert hot["info"]["token"] == "demo-v1" and hot["info"]["token_source"] == "given"
    np.testing.assert_array_equal(cold["y"], hot["y"])
    assert (root / cache.MODELS / "demo-v1.json").is_file()
    manifest, problem = cache.check(str(root))
    assert problem is None and (root / "xdg" / "taichi" / "rhi_cache.bin").is_file()
    assert any(files for _, _, files in os.walk(root / "mesa")), "Mesa's shader cache is not in DIR"


def test_default_token_is_a_fingerprint(setup):
    """Changes with the model bytes, the precision, the backend; the same for a path and its bytes."""
    data = open(setup.model, "rb").read()
    token = cache.default_token(cache.token_covers(setup.model, "cpu", "fp32"))
    assert token == cache.default_token(cache.token_covers(data, "cpu", "fp32"))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 1
    others = {cache.default_token(cache.token_covers(bytes(flipped), "cpu", "fp32")),
              cache.default_token(cache.token_covers(data, "cpu", "fp16")),
              cache.default_token(cache.token_covers(data, "vulkan", "fp32")),
              cache.default_token(cache.token_covers(data, "cpu", "fp32", max_delegated_partitions=2))}
    assert token not in others and len(others) == 4
    assert len(token) == 64 and cache.TOKEN_PATTERN.fullmatch(token)


# -- more of issue #7 (robust): records, killed processes, atomic writes, modes, stale locks --
def test_a_corrupt_model_record_is_cold_and_rewritten(warm, setup):
    """models/TOKEN.json unreadable: that model starts cold (no warning: its kernels are checked
    by the manifest, the record only says warm or cold) and the exit writes a sound record."""
    root = setup.tmp / "bad-record"
    shutil.copytree(warm[0], root)
    record = root / cache.MODELS / "rec.json"
    record.write_bytes(b"\x00garbage")
    result = setup.run(root, token="rec")
    assert result["info"]["state"] == "cold" and "unreadable" in result["info"]["reason"], result["info"]
    assert not result["warnings"] and not result["info"]["rebuilt"]
    rewritten = json.loads(record.read_text())
    assert rewritten["built"] is True and rewritten["token"] == "rec"


def test_a_process_killed_mid_run_leaves_a_sound_cache(warm, setup):
    """SIGKILL after an invoke (Taichi never dumps, no manifest is half-written): the next
    process finds the cache consistent and warns about nothing; the killed process's model
    has no record (its kernels were never dumped), so it starts cold."""
    import signal
    root = setup.tmp / "killed"
    shutil.copytree(warm[0], root)
    before = (root / cache.MANIFEST).read_bytes()
    proc, _ = setup.start(root, hang=True, token="killed")
    for line in proc.stdout:
        if line.startswith("RESULT "):
            break
    else:
        pytest.fail("the process ended before its result")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    manifest, problem = cache.check(str(root))
    assert problem is None and (root / cache.MANIFEST).read_bytes() == before
    assert not list(root.rglob(".tmp-*"))
    after = setup.run(root, token="killed")
    assert not after["warnings"] and not after["info"]["rebuilt"], after
    assert after["info"]["state"] == "cold" and "no record" in after["info"]["reason"], after["info"]
    assert (root / cache.MODELS / "killed.json").is_file()


def test_json_writes_are_atomic(tmp_path):
    """A write that fails half-way leaves the old file and no temp file; readers racing
    writers only ever see a whole file (os.replace of an fsync'ed temp file)."""
    import threading
    path = str(tmp_path / "manifest.json")
    cache._write_json(path, {"n": 0, "pad": "x" * 100000})
    with pytest.raises(TypeError):
        cache._write_json(path, {"n": 1, "bad": object()})          # json fails mid-dump
    assert json.loads(open(path).read())["n"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    stop, seen, bad = threading.Event(), [], []

    def write(k):
        for n in range(40):
            cache._write_json(path, {"n": n, "writer": k, "pad": "x" * 100000})

    def read():
        while not stop.is_set():
            obj, why = cache._read_json(path)
            (bad if why or obj is None else seen).append(why or obj["n"])
    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not bad and seen, bad[:3]
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_modes_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        root = cache.prepare_dir(tmp_path / "a" / "cache")
        cache._write_json(os.path.join(root, cache.MANIFEST), {})
    finally:
        os.umask(old)
    assert _mode(root) == 0o700
    for sub in cache.SUBDIRS:
        assert _mode(os.path.join(root, sub)) == 0o700, sub
    assert _mode(os.path.join(root, cache.MANIFEST)) == 0o600
    os.chmod(os.path.join(root, cache.MODELS), 0o777)               # loosened later: refused
    with pytest.raises(cache.CacheError, match="writable"):
        cache.prepare_dir(root)


def test_a_stale_taichi_lock_is_cleared(tmp_path):
    """Taichi skips its whole offline cache while its lock file exists; one left by a killed
    process (older than a minute) is removed at start, a fresh one is left alone."""
    root = cache.prepare_dir(tmp_path / "cache")
    lock = os.path.join(root, cache.TAICHI, cache.TAICHI_LOCK)
    open(lock, "w").close()
    cache._clear_stale_taichi_lock(root)
    assert os.path.exists(lock)
    old = time.time() - cache.STALE_TAICHI_LOCK_S - 5
    os.utime(lock, (old, old))
    cache._clear_stale_taichi_lock(root)
    assert not os.path.exists(lock)
