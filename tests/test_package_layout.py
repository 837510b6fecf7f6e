"""How ops/ and quant/ at the top of the source tree join the package (docs/layout.md, "Layout"):
installs map them in with pyproject.toml's package-dir, so a wheel holds each file once under its
one name; in the source tree two links do the same for imports that find the clone's own
tflite_taichi/ before any install. These are the only links, and they agree with package-dir."""
import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOINED = ("ops", "quant")                   # top-level folders installed as tflite_taichi.<name>
# folders the tree walk leaves out: git's, virtual environments, caches, build outputs
NOT_SOURCE = re.compile(r"^\.|^__pycache__$|^build$|^dist$|\.egg-info$")


def _package_dir(root: str) -> dict:
    """pyproject.toml's [tool.setuptools.package-dir]: package -> folder (tomllib is 3.11+)."""
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        table = f.read().split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^"([\w.]+)"\s*=\s*"([^"]+)"', table, re.MULTILINE))


def _links(root: str) -> dict:
    """Every symbolic link in the source tree: path from the root -> where it points."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not NOT_SOURCE.search(d)]
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                found[os.path.relpath(path, root).replace(os.sep, "/")] = os.readlink(path)
    return found


def test_the_only_links_join_what_package_dir_maps():
    mapped = {package: folder for package, folder in _package_dir(ROOT).items()
              if package != "tflite_taichi"}
    assert mapped == {f"tflite_taichi.{name}": name for name in JOINED}, mapped
    expected = {f"tflite_taichi/{name}": f"../{name}" for name in JOINED}
    assert _links(ROOT) == expected, "links other than the two joins, or pointing elsewhere " \
        "(docs/layout.md says why there are two and only two)"


def _source_modules(root: str) -> list:
    """The installed name (tflite_taichi/ops/conv/kernels.py) of every .py file of the
    package's three folders, walked without following links: one entry per file on disk."""
    names = []
    for top, installed in (("tflite_taichi", "tflite_taichi"),
                           *((name, f"tflite_taichi/{name}") for name in JOINED)):
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs
                       if d != "__pycache__" and not os.path.islink(os.path.join(folder, d))]
            rel = os.path.relpath(folder, os.path.join(root, top)).replace(os.sep, "/")
            prefix = installed if rel == "." else f"{installed}/{rel}"
            names += [f"{prefix}/{name}" for name in files if name.endswith(".py")]
    return names


def _can_build_wheels_here() -> bool:
    """Whether this environment's setuptools builds wheels without an index: pyproject.toml's
    minimum (64), and bdist_wheel, its own from 70.1, from the wheel package before. Otherwise
    pip fetches a build environment, as `pip install .` does."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:2])
    has_bdist_wheel = version >= (70, 1) or importlib.util.find_spec("wheel") is not None
    return version >= (64,) and has_bdist_wheel


def _build_wheel(root: str, tmp_path) -> list:
    """The file names in a wheel built from a copy of the package's sources (a build writes
    build/ and *.egg-info into the tree it builds)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(root, name), tree / name)
    for name in ("tflite_taichi", *JOINED):
        shutil.copytree(os.path.join(root, name), tree / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    isolation = ["--no-build-isolation"] if _can_build_wheels_here() else []
    # a HOME of its own: the suite leaves the user's as it found it, and pip's build environment
    # writes there (its cache is off; tool shims on PATH, such as rustup's, are not)
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir",
                          "--disable-pip-version-check", *isolation,
                          "-w", str(tmp_path / "wheel"), str(tree)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_holds_each_source_file_once_under_its_one_name(tmp_path):
    in_wheel = [n for n in _build_wheel(ROOT, tmp_path) if n.endswith(".py")]
    twice = [n for n, count in collections.Counter(in_wheel).items() if count > 1]
    assert not twice, twice
    expected = _source_modules(ROOT)
    assert sorted(in_wheel) == sorted(expected), {
        "in the wheel, not in the tree": sorted(set(in_wheel) - set(expected)),
        "in the tree, not in the wheel": sorted(set(expected) - set(in_wheel))}
    for name in JOINED:        # the joined folders really are there, not merely matched as empty
        assert f"tflite_taichi/{name}/__init__.py" in in_wheel, name
