"""`tflite-taichi inspect MODEL --explore / --node-data FILE`: what the delegate did (where
each op runs, why an op stayed on the CPU, fusion groups, per-op times) drawn on the model's
graph in Google's Model Explorer (docs/explore.md). The node data comes from
`Interpreter.node_data()`; Model Explorer (`pip install "tflite-taichi[explore]"`) is needed only
to look at it, not to write it. `--explore` serves Model Explorer's UI from our own server
(explore_server.py), which shows this one model to the user who started it alone."""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from tflite_taichi import switches
from tflite_taichi.errors import InputError

INSTALL_HINT = ('Model Explorer is not installed: pip install "tflite-taichi[explore]" (or '
                "pip install ai-edge-model-explorer); --node-data FILE writes the node data "
                "without it, for Model Explorer's UI to load")
PROFILE_RUNS = 12       # profiled invokes behind --profile's medians (the first ones' launch costs
                        # included: a median of 12 is not moved by them)


# profiling: each fusion group in a kernel of its own, so that a kernel's time is its group's,
# not that of the chunk of groups a backend merges into one launch (what the chunked kernels save
# in launches is then not in the times)
ONE_KERNEL_PER_GROUP = {"TFLITE_TAICHI_CHUNK_STEPS": "1"}


def collect(model_path: str, backend: str, profile: bool, shape_pairs=None, seed: int = 0) -> dict:
    """The node data of MODEL on `backend` (overlay -> ModelNodeData dict); with `profile`,
    after PROFILE_RUNS profiled invokes on random inputs, one kernel per fusion group."""
    from tflite_taichi.cli_inputs import apply_shapes
    from tflite_taichi.interpreter import Interpreter
    from tflite_taichi.testing import model_random_inputs
    with switches.overriding(ONE_KERNEL_PER_GROUP if profile else {}):
        it = Interpreter(model_path=model_path, backend=backend, profile=profile,
                         answer_while_compiling=False)    # the placement shown is what ran
        apply_shapes(it, shape_pairs)
        it.allocate_tensors()
        if profile:
            rng = np.random.default_rng(seed)
            for _ in range(PROFILE_RUNS):
                for d, x in zip(it.get_input_details(), model_random_inputs(it, rng)):
                    it.set_tensor(d["index"], x)
                it.invoke()
        data = it.node_data()
        it.close()
    return data


def overlay_paths(path: str, names) -> dict:
    """overlay -> file: PATH itself for "where", PATH's stem + ".<overlay>.json" beside it for
    the others (out.json -> out.why.json, out.fusion.json, out.time.json)."""
    stem = path[:-5] if path.endswith(".json") else path
    return {name: path if name == "where" else f"{stem}.{name}.json" for name in names}


def write(data: dict, path: str) -> dict:
    """Each overlay as the JSON file Model Explorer's UI loads; overlay -> the file written."""
    paths = overlay_paths(path, data)
    for name, target in paths.items():
        with open(target, "w", encoding="utf-8") as f:
            json.dump(data[name], f, indent=1)
    return paths


def model_explorer():
    """Model Explorer's package, or an InputError saying how to get it."""
    try:
        import model_explorer          # optional: the [explore] extra
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    return model_explorer


def explorer_config(model_path: str, data: dict):
    """Model Explorer's config: the model (its own TFLite adapter draws it) and our overlays."""
    from tflite_taichi.node_data import OVERLAYS
    from tflite_taichi.tools.explore_server import TFLITE_ADAPTER
    config = model_explorer().config()
    config.add_model_from_path(os.path.abspath(model_path), adapterId=TFLITE_ADAPTER)
    for name, overlay in data.items():
        config.add_node_data(name=OVERLAYS[name], node_data=json.dumps(overlay))
    return config


def start_server(model_path: str, data: dict, port: Optional[int] = None):
    """Model Explorer's UI on the model with our overlays, on 127.0.0.1 for the holder of the
    token in its `url` alone (tools/explore_server.py says what it serves); not yet serving."""
    from tflite_taichi.tools.explore_server import ExploreServer
    config = explorer_config(model_path, data)
    node_data = [config.get_node_data(i) for i in range(len(data))]
    return ExploreServer(model_path, node_data, config.to_url_param_value(), port=port)


def serve(model_path: str, data: dict, port: Optional[int] = None, open_browser: bool = True) -> None:
    """Serve the model with our overlays in Model Explorer's UI until interrupted."""
    server = start_server(model_path, data, port)
    print(f"Model Explorer on {model_path}, for this user only (the address holds its token):\n"
          f"{server.url}\nCtrl-C stops it.", flush=True)
    launch_page = open_in_browser(server.url) if open_browser else None
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        if launch_page is not None:
            os.remove(launch_page)


LAUNCH_PAGE = ('<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}">'
               '<title>Model Explorer</title><a href="{url}">Model Explorer</a>\n')


def open_in_browser(url: str) -> str:
    """Open `url` through a page only this user can read, as Jupyter does:
    a browser started with the URL itself would show its token to every local user in its
    command line. The page's path, to remove when the server stops."""
    import html
    import pathlib
    import tempfile
    import webbrowser
    fd, page = tempfile.mkstemp(prefix="tflite-taichi-explore-", suffix=".html")   # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(LAUNCH_PAGE.format(url=html.escape(url, quote=True)))
    webbrowser.open_new_tab(pathlib.Path(page).as_uri())
    return page
