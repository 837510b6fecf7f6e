"""The package's version, in one place: pyproject.toml reads it (setuptools' dynamic version),
the package exports it, and the kernel cache keys its modules by it (runtime/cache.py)."""
__version__ = "0.1.0"
