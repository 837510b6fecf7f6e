"""The kernel cache (tflite_taichi.runtime.cache): AOT modules compiled once and loaded through Taichi's
C API by later processes, robust to killed processes, torn writes and full disks. Every Taichi run is its own subprocess:
a warm start is a new process."""
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import types
import warnings

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.runtime import cache, session
from tflite_taichi.tools.demo import build_demo_model

TAICHI_BACKENDS = os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",")

RUN = r'''
import json, sys, warnings
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter, backend
from tflite_taichi.runtime import session
from tflite_taichi.runtime.cache import CacheError, CacheWarning
kwargs = {"cache_dir": args["cache_dir"]} if "cache_dir" in args else {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = Interpreter(model_path=args["model"], backend=args["backend"], model_token=args.get("token"),
                     **kwargs)
    it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.load(args["input"]))
it.invoke()
np.save(args["output"], it.get_tensor(it.get_output_details()[0]["index"]))
result = {"info": it.summary()["cache"], "runtime": it.summary()["runtime"],
          "python_taichi": session.SESSION.python_taichi,
          "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]}
if args.get("other_model"):        # a token names a record only: another model under it is cold
    reused = Interpreter(model_path=args["other_model"], backend=args["backend"],
                         cache_dir=args["cache_dir"], model_token=result["info"]["token"])
    reused.allocate_tensors()
    result["reused_token"] = reused.summary()["cache"]
    other = Interpreter(model_path=args["model"], backend=args["backend"],     # another folder in
                        cache_dir=args["cache_dir"] + "-second")               # the same process
    other.allocate_tensors()
    result["second_dir"] = other.summary()["cache"]
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


def _env(**extra):
    env = dict(os.environ, ENABLE_TAICHI_HEADER_PRINT="False", PYTHONUNBUFFERED="1", **extra)
    for var in cache.DRIVER_ENV:
        env.pop(var, None)           # the cache must not need them
    # ...but without them, and with the cache off, Taichi writes ~/.cache/taichi (version_info,
    # ticache/): a home inside the run's temporary folder (conftest) takes that, not the user's
    home = os.path.join(os.environ["XDG_CACHE_HOME"], "home-of-subprocesses")
    os.makedirs(home, exist_ok=True)
    env["HOME"] = extra.get("HOME", home)
    return env


def _spawn(script, args, cwd, **env):
    return subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], cwd=cwd,
                            env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _result(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-3000:]
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

    def start(self, cache_dir, backend="cpu", env=None, **extra):
        self.runs += 1
        output = str(self.tmp / f"out{self.runs}.npy")
        args = {"model": self.model, "input": self.input, "output": output, "backend": backend,
                **extra}
        if cache_dir is not None:
            args["cache_dir"] = cache_dir if cache_dir is False else str(cache_dir)
        return _spawn(RUN, args, self.tmp, **(env or {})), output

    def run(self, cache_dir, backend="cpu", env=None, **extra):
        proc, output = self.start(cache_dir, backend, env, **extra)
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
    warm = setup.run(root)
    return root, cold, warm


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _modules(root):
    return sorted(p for p in (root / cache.MODULES).iterdir() if not p.name.startswith("."))


def test_cold_then_warm_same_outputs_without_taichis_frontend(warm, setup):
    root, cold, hot = warm
    assert cold["info"]["state"] == "cold" and "never built" in cold["info"]["reason"], cold["info"]
    assert hot["info"]["state"] == "warm", hot["info"]
    assert not cold["warnings"] and not hot["warnings"]
    np.testing.assert_array_equal(cold["y"], hot["y"])
    covers = cache.token_covers(setup.model, "cpu", "fp32")
    assert cold["info"]["token"] == hot["info"]["token"] == cache.default_token(covers)
    assert cold["info"]["token_source"] == "fingerprint"
    # the cold process had its kernels compiled by worker processes (Taichi's Python frontend
    # never started in it); the warm one loaded them
    assert cold["python_taichi"] is None and hot["python_taichi"] is None
    assert cold["runtime"]["compiled_in"] == "1 worker process", cold["runtime"]
    assert hot["runtime"]["compiled_in"] is None
    assert cold["runtime"]["device"] == hot["runtime"]["device"] == "capi"
    assert cold["runtime"]["build_s"] > 0 and hot["runtime"]["build_s"] == 0


def test_without_compile_workers_the_process_compiles_and_the_cache_is_the_same(warm, setup, tmp_path):
    """TFLITE_TAICHI_COMPILE_WORKERS=0: Taichi's frontend runs in the process itself, and what it
    caches is what the workers cached (same module keys, same outputs; the other run is warm)."""
    root = tmp_path / "cache"
    here = setup.run(root, env={"TFLITE_TAICHI_COMPILE_WORKERS": "0"})
    assert here["python_taichi"] == "cpu" and here["info"]["state"] == "cold"
    assert here["runtime"]["compiled_in"] == "this process (TFLITE_TAICHI_COMPILE_WORKERS=0)"
    np.testing.assert_array_equal(here["y"], warm[1]["y"])
    assert _modules(root) and [p.name for p in _modules(root)] == [p.name for p in _modules(warm[0])]


def test_cache_dir_is_private_and_consistent(warm):
    root = warm[0]
    assert _mode(root) == 0o700
    for sub in cache.SUBDIRS:
        assert _mode(root / sub) == 0o700, sub
    records = list((root / cache.MODELS).iterdir())
    assert len(records) == 1 and _mode(records[0]) == 0o600
    [module] = _modules(root)
    assert _mode(module) == 0o700 and _mode(module / cache.META) == 0o600
    meta = json.loads((module / cache.META).read_text())
    assert meta["key"] == module.name and meta["arch"] in ("x64", "arm64") and meta["files"]
    for rel, digest in meta["files"].items():
        assert _mode(module / rel) == 0o600
        assert cache._file_digest(str(module / rel)) == digest
    assert cache.ModuleStore(str(root)).check(module.name, meta["arch"]) is None
    assert not list(root.rglob(".tmp-*"))           # atomic writes leave no temp files


@pytest.fixture(scope="module")
def reused(warm, setup):
    root = setup.tmp / "reused" / "cache"
    shutil.copytree(warm[0], root)
    other_model = setup.tmp / "other.tflite"
    other_model.write_bytes(build_demo_model(seed=1))
    return setup.run(root, other_model=str(other_model))


def test_a_token_reused_for_another_model_is_cold(reused):
    """A token only names a record: the module key covers the model bytes, so another model
    under the same token compiles its own kernels, and is told why."""
    assert reused["info"]["state"] == "warm"
    other = reused["reused_token"]
    assert other["state"] == "cold" and other["token_source"] == "given"
    assert "recorded for something else" in other["reason"] and "model_sha256" in other["reason"]


def test_interpreters_of_one_process_may_use_different_cache_dirs(reused):
    """Each interpreter names its folder; a module the process has loaded already is shared
    (warm) whichever folder a later interpreter of the same program names."""
    second = reused["second_dir"]
    assert second["dir"].endswith("cache-second") and second["state"] == "warm", second


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
             ("token_no_cache", {"cache_dir": False, "model_token": "fine"}),
             ("dir_not_path", {"cache_dir": 3})]
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
    assert out["token_no_cache"].startswith("InputError") and "cache_dir=False" in out["token_no_cache"]
    assert out["dir_not_path"].startswith("InputError") and "cache_dir must be" in out["dir_not_path"]
    assert not (tmp / "ok").exists() and not (setup.tmp / "evil").exists()


def _module_file(root):
    """The largest file of the one module in the cache."""
    [module] = _modules(root)
    return max((p for p in module.rglob("*") if p.is_file() and p.name != cache.META),
               key=lambda p: p.stat().st_size)


def _truncate(root):
    path = _module_file(root)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _bitflip(root):
    path = _module_file(root)
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x08
    path.write_bytes(bytes(data))


def _unlisted_file(root):
    path = _module_file(root)
    shutil.copy(path, path.with_name("extra" + path.suffix))


def _missing_file(root):
    _module_file(root).unlink()


def _garbage_meta(root):
    [module] = _modules(root)
    (module / cache.META).write_bytes(b'{"format": 2, "files": {"module')


def _foreign_arch(root):
    [module] = _modules(root)
    meta = json.loads((module / cache.META).read_text())
    meta["arch"] = "cuda"
    (module / cache.META).write_text(json.dumps(meta))


def _planted_symlink(root):
    path = _module_file(root)
    os.symlink("/etc/passwd", path.with_name("planted" + path.suffix))


@pytest.mark.parametrize("damage, says", [
    (_truncate, "truncated"), (_bitflip, "sha256 (corrupt)"), (_unlisted_file, "is not in its meta.json"),
    (_missing_file, "is missing"), (_garbage_meta, "meta.json is unreadable"),
    (_foreign_arch, "built for 'cuda'"), (_planted_symlink, "is not a regular file"),
], ids=["truncated", "bitflip", "unlisted-file", "missing-file", "garbage-meta", "foreign-arch",
        "symlink"])
def test_damaged_module_is_detected_and_rebuilt(warm, setup, damage, says):
    root = setup.tmp / f"damaged-{damage.__name__}"
    shutil.copytree(warm[0], root, symlinks=True)
    damage(root)
    result = setup.run(root)
    assert len(result["warnings"]) == 1 and "are not used" in result["warnings"][0], result["warnings"]
    assert says in result["warnings"][0], result["warnings"][0]
    assert result["info"]["state"] == "cold" and says in result["info"]["reason"], result["info"]
    np.testing.assert_array_equal(result["y"], warm[1]["y"])
    [module] = _modules(root)                                   # rebuilt, consistent again
    meta = json.loads((module / cache.META).read_text())
    assert cache.ModuleStore(str(root)).check(module.name, meta["arch"]) is None
    again = setup.run(root)
    assert again["info"]["state"] == "warm" and not again["warnings"], again["info"]


@pytest.mark.skipif("vulkan" not in TAICHI_BACKENDS, reason="vulkan not in TFLITE_TAICHI_TEST_BACKENDS")
def test_a_module_the_c_api_refuses_is_rebuilt(setup):
    """A module whose files match its meta.json but that does not load (here: not a zip at
    all; in life: another driver or device) is rebuilt with a CacheWarning."""
    root = setup.tmp / "refused"
    setup.run(root, backend="vulkan")
    [module] = _modules(root)
    meta = json.loads((module / cache.META).read_text())
    (module / meta["module"]).write_bytes(b"this is not a Taichi module")
    meta["files"][meta["module"]] = cache._file_digest(str(module / meta["module"]))
    (module / cache.META).write_text(json.dumps(meta))
    result = setup.run(root, backend="vulkan")
    assert len(result["warnings"]) == 1 and "the C API refused it" in result["warnings"][0], result
    assert result["info"]["state"] == "cold"
    assert setup.run(root, backend="vulkan")["info"]["state"] == "warm"


def test_two_processes_at_once_share_a_cache(setup):
    root = setup.tmp / "shared"
    started = [setup.start(root) for _ in range(2)]
    for proc, output in started:
        result = _result(proc)
        assert not result["warnings"], result["warnings"]
        np.testing.assert_allclose(np.load(output), setup.expected, rtol=1e-5, atol=1e-6)
    [module] = _modules(root)
    assert not list((root / cache.MODULES).glob(".tmp-*"))
    assert setup.run(root)["info"]["state"] == "warm"


@pytest.mark.skipif("vulkan" not in TAICHI_BACKENDS, reason="vulkan not in TFLITE_TAICHI_TEST_BACKENDS")
def test_vulkan_cold_then_warm_with_a_given_token(setup):
    """lavapipe on CI: the module is a .tcm archive, Mesa's shader cache lands in DIR too."""
    root = setup.tmp / "vulkan"
    cold = setup.run(root, backend="vulkan", token="demo-v1")
    hot = setup.run(root, backend="vulkan", token="demo-v1")
    assert (cold["info"]["state"], hot["info"]["state"]) == ("cold", "warm"), hot["info"]
    assert hot["info"]["token"] == "demo-v1" and hot["info"]["token_source"] == "given"
    assert hot["python_taichi"] is None
    np.testing.assert_array_equal(cold["y"], hot["y"])
    assert (root / cache.MODELS / "demo-v1.json").is_file()
    [module] = _modules(root)
    assert (module / "module.tcm").is_file()
    assert any(files for _, _, files in os.walk(root / "mesa")), "Mesa's shader cache is not in DIR"


def test_default_cache_is_per_user_and_cache_dir_false_writes_nothing(setup):
    """cache_dir=None: $TFLITE_TAICHI_CACHE_DIR (else ~/.cache/tflite_taichi), so a second run
    of a script is warm; cache_dir=False: no cache, nothing written there."""
    home = setup.tmp / "user-cache"
    env = {"TFLITE_TAICHI_CACHE_DIR": str(home)}
    off = setup.run(False, env=env)
    assert off["info"]["state"] == "cold" and off["info"]["dir"] is None
    assert "cache is off" in off["info"]["reason"] and not home.exists()
    first, second = setup.run(None, env=env), setup.run(None, env=env)
    assert (first["info"]["state"], second["info"]["state"]) == ("cold", "warm")
    assert first["info"]["dir"] == str(home.resolve()) and _mode(home) == 0o700
    assert setup.run(False, env=env)["info"]["state"] == "cold"


def test_default_token_is_a_fingerprint(setup, monkeypatch):
    """Changes with the model bytes, the precision, the backend, a kernel switch; the same for a
    path and its bytes. (The token names the model's record; what selects a cached module is
    the module key, held below.)"""
    data = open(setup.model, "rb").read()
    token = cache.default_token(cache.token_covers(setup.model, "cpu", "fp32"))
    assert token == cache.default_token(cache.token_covers(data, "cpu", "fp32"))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 1
    others = {cache.default_token(cache.token_covers(bytes(flipped), "cpu", "fp32")),
              cache.default_token(cache.token_covers(data, "cpu", "fp16")),
              cache.default_token(cache.token_covers(data, "vulkan", "fp32")),
              cache.default_token(cache.token_covers(data, "cpu", "fp32", max_delegated_partitions=2)),
              cache.default_token(cache.token_covers(data, "cpu", "fp32", reference_ops={"CONV_2D"}))}
    assert token not in others and len(others) == 5
    assert len(token) == 64 and cache.TOKEN_PATTERN.fullmatch(token)
    with monkeypatch.context() as switched:
        switched.setenv("TFLITE_TAICHI_NO_SHARED_TILES", "1")     # a switch that changes kernels
        assert cache.default_token(cache.token_covers(data, "cpu", "fp32")) != token
    assert cache.default_token(cache.token_covers(data, "cpu", "fp32")) == token


# -- the module key: what selects a cached module ------------------------------------------------
def _program_keys(root, covers: dict, subgraph=0, shapes=None, plan="0" * 64, kernels=(2, 1),
                  token=None) -> list:
    """The cache keys of a program's modules, derived as ProgramKernels derives them for a
    program of len(kernels) partitions of kernels[i] kernels each (no device, no compile)."""
    from tflite_taichi.runtime.kernels import ProgramKernels
    model_cache = cache.ModelCache(str(root), token or cache.default_token(covers),
                                   token is not None, covers)
    codes = [types.SimpleNamespace(chunks=[[0]] * n) for n in kernels]
    names = [[f"p{i}_k{j}" for j in range(n)] for i, n in enumerate(kernels)]
    shapes = {0: (1, 8)} if shapes is None else shapes
    return ProgramKernels(None, codes, names, "cpu", False, subgraph, shapes, plan, model_cache,
                          []).keys


def _flip_a_byte(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 1
    return bytes(flipped)


# how to change each thing the module key covers, the real way (what token_covers reads)
COVERS_CHANGES = {
    "model_sha256": lambda mp, args: args.update(source=_flip_a_byte(args["source"])),
    "model_size": lambda mp, args: args.update(source=args["source"] + b"\0"),
    "backend": lambda mp, args: args.update(backend="vulkan"),
    "precision": lambda mp, args: args.update(precision="fp16"),
    "max_delegated_partitions": lambda mp, args: args.update(max_delegated_partitions=2),
    "preserve_all_tensors": lambda mp, args: args.update(preserve_all_tensors=True),
    "reference_ops": lambda mp, args: args.update(reference_ops={"ADD"}),
    "format": lambda mp, args: mp.setattr(cache, "FORMAT", cache.FORMAT + 1),
    "taichi": lambda mp, args: mp.setattr(cache, "taichi_version", lambda: "0.0.1"),
    "tflite_taichi": lambda mp, args: mp.setattr("tflite_taichi.version.__version__", "0.0.0+other"),
    "tflite_taichi_source": lambda mp, args: mp.setattr(cache, "_package_source_digest", lambda: "0" * 16),
    "numpy": lambda mp, args: mp.setattr(np, "__version__", "0.0.1"),
    "python": lambda mp, args: mp.setattr(cache, "sys", types.SimpleNamespace(version_info=(2, 7, 18))),
    "machine": lambda mp, args: mp.setattr(cache.platform, "machine", lambda: "riscv64"),
    "system": lambda mp, args: mp.setattr(cache.platform, "system", lambda: "Plan9"),
    "switches": lambda mp, args: mp.setenv("TFLITE_TAICHI_FUSION", "none"),
}
# a valid value other than the default for every switch that changes the kernels
KERNEL_SWITCH_VALUES = {
    "TFLITE_TAICHI_FUSION": "none", "TFLITE_TAICHI_CHUNK_STEPS": "1",
    "TFLITE_TAICHI_IO_CODES": "0", "TFLITE_TAICHI_SPIRV_CAPS_OFF": "spirv_has_int64",
    "TFLITE_TAICHI_NO_SHARED_TILES": "1", "TFLITE_TAICHI_GEMM_TILES": "8,8,2,2",
    "TFLITE_TAICHI_GEMM_MIN_BLOCKS": "7", "TFLITE_TAICHI_POINTWISE_SPLIT": "0",
}


def _covers_args(setup) -> dict:
    return {"source": open(setup.model, "rb").read(), "backend": "cpu", "precision": "fp32"}


def test_every_input_of_the_module_key_has_a_test(setup):
    """A field added to what the key covers, or a switch marked as changing kernels, needs a
    way to change it above: else nothing would hold that the key changes with it."""
    assert set(cache.token_covers(**_covers_args(setup))) == set(COVERS_CHANGES)
    from tflite_taichi import switches
    assert set(KERNEL_SWITCH_VALUES) == {n for n, s in switches.SWITCHES.items() if s.kernels}


def test_the_module_key_is_the_same_for_the_same_program(setup, tmp_path):
    """The counterpart of the tests below (a key that changed every time would pass them):
    one key per module, the same for the same program whoever computes it, whether or not a
    model_token was given (a token names a record, not the kernels), and distinct per module."""
    covers = cache.token_covers(**_covers_args(setup))
    keys = _program_keys(tmp_path, covers)
    assert len(keys) == 3 and len(set(keys)) == 3 and all(cache.KEY_PATTERN.fullmatch(k) for k in keys)
    again = cache.token_covers(**_covers_args(setup))
    assert _program_keys(tmp_path, again) == keys
    assert _program_keys(tmp_path, again, token="given-token") == keys


@pytest.mark.parametrize("field", sorted(COVERS_CHANGES))
def test_the_module_key_changes_with_what_the_token_covers(setup, tmp_path, monkeypatch, field):
    """Each thing the kernels depend on, changed where token_covers reads it, changes every
    module's key: a module built under the old value is never loaded for the new one."""
    args = _covers_args(setup)
    before = cache.token_covers(**args)
    keys = _program_keys(tmp_path, before)
    COVERS_CHANGES[field](monkeypatch, args)
    after = cache.token_covers(**args)
    assert after[field] != before[field]
    assert not set(_program_keys(tmp_path, after)) & set(keys), field


@pytest.mark.parametrize("name", sorted(KERNEL_SWITCH_VALUES))
def test_the_module_key_changes_with_every_kernel_switch(setup, tmp_path, monkeypatch, name):
    from tflite_taichi import switches
    keys = _program_keys(tmp_path, cache.token_covers(**_covers_args(setup)))
    monkeypatch.setenv(name, KERNEL_SWITCH_VALUES[name])
    assert switches.value(name) != switches.SWITCHES[name].default      # a real change
    assert not set(_program_keys(tmp_path, cache.token_covers(**_covers_args(setup)))) & set(keys)


def test_a_switch_that_leaves_the_kernels_alone_leaves_the_module_key(setup, tmp_path, monkeypatch):
    """Where the kernels are compiled (workers or this process) caches the same modules."""
    keys = _program_keys(tmp_path, cache.token_covers(**_covers_args(setup)))
    monkeypatch.setenv("TFLITE_TAICHI_COMPILE_WORKERS", "0")
    assert _program_keys(tmp_path, cache.token_covers(**_covers_args(setup))) == keys


@pytest.mark.parametrize("change", [
    {"subgraph": 1},                                     # a WHILE's body, say
    {"shapes": {0: (1, 9)}},                             # resize_tensor_input
    {"shapes": {1: (1, 8)}},                             # another input tensor
    {"plan": "1" * 64},                                  # another offset, fusion, budget...
    {"kernels": (2, 2)},                                 # split into more modules
], ids=["subgraph", "shape", "input-tensor", "plan", "module-split"])
def test_the_module_key_changes_with_the_program(setup, tmp_path, change):
    """What the program adds to the model's covers: the subgraph, its input shapes, its plan's
    digest (every offset and choice the kernels bake in) and how its kernels are split."""
    covers = cache.token_covers(**_covers_args(setup))
    assert not set(_program_keys(tmp_path, covers, **change)) & set(_program_keys(tmp_path, covers))


class _KeysTaken(BaseException):
    """Raised in place of getting the kernels: the keys were all a test wanted (not an
    Exception, which the delegate would take for a C API failure and compile in Python)."""


def test_the_thread_budget_reaches_the_module_key(tmp_path, monkeypatch):
    """The cpu backend's loops are compiled for the interpreter's thread budget (serial on one
    thread), so another budget must select other modules: the keys a real program asks the
    cache for differ, not only its plan's digest (nothing is compiled)."""
    from tflite_taichi.builder import ModelBuilder
    from tflite_taichi.runtime import kernels
    b = ModelBuilder()
    g = b.subgraph()
    x, y = g.input("x", (1, 1 << 18)), g.tensor("y", (1, 1 << 18))    # big: threads pay
    g.op("ADD", [x, g.const("c", np.ones((1, 1 << 18), np.float32))], [y])
    g.output(y)
    model = b.finish()

    def take_keys(program):
        raise _KeysTaken(list(program.keys))
    monkeypatch.setattr(kernels.ProgramKernels, "get", take_keys)
    asked = []
    for threads in (1, 2):
        it = Interpreter(model_content=model, backend="cpu", cache_dir=str(tmp_path),
                         num_threads=threads)
        with pytest.raises(_KeysTaken) as taken, warnings.catch_warnings():
            warnings.simplefilter("ignore")         # which ops run where: not this test's
            it.allocate_tensors()
        asked.append(taken.value.args[0])
    assert all(asked) and not set(asked[0]) & set(asked[1]), asked


# -- robustness: records, killed processes, atomic writes, modes, eviction ------
def test_a_corrupt_model_record_is_rewritten(warm, setup):
    """models/TOKEN.json unreadable: the record only says what the token covered (the module
    key does not depend on it), so the kernels still load, and a sound record is written."""
    root = setup.tmp / "bad-record"
    shutil.copytree(warm[0], root)
    setup.run(root, token="rec")
    record = root / cache.MODELS / "rec.json"
    record.write_bytes(b"\x00garbage")
    result = setup.run(root, token="rec")
    assert result["info"]["state"] == "warm" and not result["warnings"], result["info"]
    rewritten = json.loads(record.read_text())
    assert rewritten["token"] == "rec" and rewritten["covers"]["backend"] == "cpu"


def test_a_process_killed_mid_run_leaves_a_sound_cache(warm, setup):
    """SIGKILL after an invoke: the module was committed whole when it was built, so the next
    process loads it without a warning; a temporary folder a killed build left behind is
    ignored, and removed once it is old."""
    import signal
    root = setup.tmp / "killed"
    shutil.copytree(warm[0], root)
    proc, _ = setup.start(root, hang=True, token="killed")
    for line in proc.stdout:
        if line.startswith("RESULT "):
            break
    else:
        pytest.fail("the process ended before its result")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    half = root / cache.MODULES / ".tmp-0123456789abcdef"       # as a build killed mid-way leaves it
    half.mkdir()
    (half / "module").write_bytes(b"half")
    after = setup.run(root, token="killed")
    assert not after["warnings"] and after["info"]["state"] == "warm", after
    store = cache.ModuleStore(str(root))
    with cache.locked(str(root)):               # as a commit evicts
        store._evict(keep="")
    assert half.exists()                        # young: it may be another process's build
    old = time.time() - cache.STALE_TEMP_S - 5
    os.utime(half, (old, old))
    with cache.locked(str(root)):
        store._evict(keep="")
    assert not half.exists() and len(_modules(root)) == 1


def test_json_writes_are_atomic(tmp_path):
    """A write that fails half-way leaves the old file and no temp file; readers racing
    writers only ever see a whole file (os.replace of an fsync'ed temp file)."""
    import threading
    path = str(tmp_path / "record.json")
    cache._write_json(path, {"n": 0, "pad": "x" * 100000})
    with pytest.raises(TypeError):
        cache._write_json(path, {"n": 1, "bad": object()})          # json fails mid-dump
    assert json.loads(open(path).read())["n"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
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
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_modes_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        root = cache.prepare_dir(tmp_path / "a" / "cache")
        store = cache.ModuleStore(root)
        key = "a" * 64
        with store.building() as folder:
            with open(os.path.join(folder, "module.tcm"), "wb") as f:
                f.write(b"x" * 10)
            path = store.commit(key, folder, "module.tcm", "vulkan", {})
    finally:
        os.umask(old)
    assert _mode(root) == 0o700
    for sub in cache.SUBDIRS:
        assert _mode(os.path.join(root, sub)) == 0o700, sub
    assert _mode(path) == 0o600 and _mode(os.path.dirname(path)) == 0o700
    assert _mode(os.path.join(os.path.dirname(path), cache.META)) == 0o600
    os.chmod(os.path.join(root, cache.MODELS), 0o777)               # loosened later: refused
    with pytest.raises(cache.CacheError, match="writable"):
        cache.prepare_dir(root)


def test_least_recently_used_modules_are_evicted(tmp_path, monkeypatch):
    """The folder stays under TFLITE_TAICHI_CACHE_MAX_MB: the modules used longest ago go
    (loading a module marks it used)."""
    monkeypatch.setenv("TFLITE_TAICHI_CACHE_MAX_MB", str(250_000 / (1 << 20)))
    monkeypatch.setattr(cache, "EVICT_EVERY", 1)       # a scan at every commit (default: every 64th)
    store = cache.ModuleStore(cache.prepare_dir(tmp_path / "cache"))
    a, b, c, d = (ch * 64 for ch in "abcd")

    def commit(key, age):
        with store.building() as folder:
            with open(os.path.join(folder, "module.tcm"), "wb") as f:
                f.write(bytes(100_000))
            store.commit(key, folder, "module.tcm", "vulkan", {})
        stamp = time.time() - age
        os.utime(os.path.join(store.path(key), cache.META), (stamp, stamp))

    commit(a, 1000)
    commit(b, 999)
    commit(c, 998)                      # three do not fit: the oldest, a, goes
    assert [os.path.isdir(store.path(k)) for k in (a, b, c)] == [False, True, True]
    with store.opened(b, "vulkan") as (found, problem):     # b used now: c is the least
        assert found is not None and problem is None      # recently used
    commit(d, 0)
    assert [os.path.isdir(store.path(k)) for k in (b, c, d)] == [True, False, True]


def test_eviction_scans_only_every_so_many_commits(tmp_path, monkeypatch):
    """A scan of every module folder at each commit made a test run's thousands of commits
    quadratic: a process scans at its first commit, then every EVICT_EVERY-th or after a minute."""
    root = cache.prepare_dir(tmp_path / "cache")
    monkeypatch.setattr(session.SESSION, "evictions", {})
    scans = []
    monkeypatch.setattr(cache.ModuleStore, "_evict", lambda self, keep: scans.append(keep))
    store = cache.ModuleStore(root)
    for n in range(cache.EVICT_EVERY * 2 + 1):
        with store.building() as folder:
            with open(os.path.join(folder, "module.tcm"), "wb") as f:
                f.write(b"x")
            store.commit(f"{n:064x}", folder, "module.tcm", "vulkan", {})
    assert len(scans) == 3, scans                    # the first, the 64th after it, the 128th
    monkeypatch.setitem(session.SESSION.evictions, root, (0, time.time() - cache.EVICT_AFTER_S - 1))
    with store.building() as folder:
        with open(os.path.join(folder, "module.tcm"), "wb") as f:
            f.write(b"x")
        store.commit("f" * 64, folder, "module.tcm", "vulkan", {})
    assert len(scans) == 4                           # a minute since the last scan


STALE_LOCK_RUN = r'''
import warnings
warnings.simplefilter("ignore")
from tflite_taichi import Interpreter
from tflite_taichi.tools.demo import build_demo_model
it = Interpreter(model_content=build_demo_model(), backend="cpu")   # cold: Taichi's frontend runs
it.allocate_tensors()
it.invoke()
print("RESULT", it.summary()["cache"]["state"], flush=True)
'''


def test_taichi_keeps_its_files_in_our_cache_and_a_stale_lock_there_is_removed(tmp_path):
    """Taichi's compilation manager kept ticache.lock in ~/.cache/taichi, and a
    process killed while holding it left every later one printing "Lock ... failed". Its folder
    is now inside the cache folder, and a stale lock there is removed before Taichi starts."""
    home, root = tmp_path / "home", tmp_path / "cache"
    taichi_dir = root / "taichi"
    taichi_dir.mkdir(parents=True)
    home.mkdir()
    lock, metadata = taichi_dir / "ticache.lock", taichi_dir / "ticache.tcb"
    lock.write_bytes(b"")
    metadata.write_bytes(b"")                # Taichi takes the lock only where metadata exists
    old = time.time() - 2 * cache.STALE_TAICHI_LOCK_S
    os.utime(lock, (old, old))
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env.update(HOME=str(home), TFLITE_TAICHI_CACHE_DIR=str(root))
    out = subprocess.run([sys.executable, "-c", STALE_LOCK_RUN], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "RESULT cold" in out.stdout, out.stderr[-2000:]
    assert "Lock" not in out.stderr, out.stderr[-2000:]
    # the stale lock is gone; a lock there now is a newer one (CI once found one after the run:
    # a compile worker, killed as its parent exited, may hold Taichi's for its metadata write)
    assert not lock.exists() or os.stat(lock).st_mtime > old + cache.STALE_TAICHI_LOCK_S, \
        "the stale lock was left in place"
    assert not (home / ".cache" / "taichi" / "ticache").exists()


def test_a_fresh_taichi_lock_is_left_alone(tmp_path):
    folder = tmp_path / "taichi"
    folder.mkdir()
    (folder / "ticache.lock").write_bytes(b"")    # another process holds it right now
    assert cache.remove_stale_taichi_lock(str(folder)) is False
    assert (folder / "ticache.lock").exists()


def test_taichi_version_is_the_installed_distributions():
    """The cache key's taichi version, read from the METADATA beside the package rather than
    through importlib.metadata (60 ms to import), is what pip installed."""
    import importlib.metadata
    from tflite_taichi.runtime import cache as cache_mod
    assert cache_mod.taichi_version() == importlib.metadata.version("taichi")


def test_the_source_digest_covers_every_folder_kernels_come_from():
    """The default token hashes the sources kernels are generated from: the package's own
    folder (codegen.py, planner.py), its runtime wing, ops and quant, wherever cache.py lives."""
    from tflite_taichi import codegen, quant
    from tflite_taichi.ops import conv
    from tflite_taichi.runtime import cache as cache_mod, kernels
    folders = set(cache_mod._package_source_folders())
    for module in (codegen, conv, quant, kernels):
        assert os.path.realpath(os.path.dirname(module.__file__)) in folders, module.__name__
