"""Which Taichi step, tile shape and split an instance of the family runs with, per arch: the
split-K count of a gather, the shared-memory GEMM tiles where an arch has block-shared memory
and the product has enough tiles of a measured class (the thresholds below, each with its
measurement).
"""
from tflite_taichi import switches

from .. import kit
from ..kit import SPLIT_THREADS, split_count
from .kernels import GEMM_CONFIG, GEMM_K, PIXEL_TILE, gemm_blocks

# Split-K: an op with few outputs and a long reduction (a classifier's 1x1 conv or FC: 1000
# outputs of 1024 terms) would leave most of a GPU idle while each thread walks the reduction
# alone; it is split into SPLIT_K partial sums per output, written to scratch by one task
# and added (with bias and activation) by a second.
SPLIT_K_THREADS = SPLIT_THREADS     # below this many outputs, split the reduction...
SPLIT_K_MIN_TERMS = 64              # ...into chunks of at least this many input channels


def split_k(n_out: int, channels: int) -> int:
    """How many partial sums per output: enough to give ~SPLIT_K_THREADS threads."""
    return split_count(n_out, channels, SPLIT_K_MIN_TERMS)


def pointwise_splits(pixels: int, c_in: int, c_out: int) -> int:
    """Partial sums per output of a PointwiseConvStep: its threads (a PIXEL_TILE of pixels by
    one output channel each) counted, not its outputs, so a classifier tail's 14x14x512 conv
    (25K threads of 512 terms) splits in 3 and its 7x7x1024 one in 5.
    TFLITE_TAICHI_POINTWISE_SPLIT=0 (bench/'s A/B switch) counts outputs, as other convs do."""
    if not switches.value("TFLITE_TAICHI_POINTWISE_SPLIT"):
        return split_k(pixels * c_out, c_in)
    return split_count(-(-pixels // PIXEL_TILE) * c_out, c_in, SPLIT_K_MIN_TERMS)


# Below this many tiles the op runs as the register-tiled gather (PointwiseConvStep). Measured on
# the H200 (bench/results/gemm_tiles.md): in whole batch-1 models a kernel with tiled ops ran
# slower (MobileNet v1 on cuda 1.2-1.5 ms against 0.83-1.0 ms without, alternating in one
# process), although an isolated chain of 112x112x64 layers ran 15% faster tiled; at batch 32,
# tiling every pointwise conv and FC raised MobileNet from 1436 to 2368 images/s on cuda and
# from 1179 to 1717 on vulkan. Batch-1 ops of the models here have at most 256 tiles, batch-32
# MobileNet's at least 400: tiles are for batches (and very large images).
GEMM_MIN_BLOCKS = 400
# The small-grid class, on Vulkan: a product with too few 64x64 tiles to fill the GPU but at
# least SMALL_GRID_MIN_BLOCKS of 32x32 (PoseNet's and DeepLab's 17x17 and 33x33 pointwise convs
# of 256-1024 channels) runs as 32x32 tiles of 2x2 per thread. Measured on the H200 with our own
# Vulkan submissions (bench/results/gpu_table_h200.md, section 1): an isolated 17x17
# 1024->1024 layer 430 -> 157 us, 33x33x256 93 -> 65 us; whole PoseNet 1.08-1.15 -> 0.86-0.89 ms, DeepLab v3 and
# MobileNet v2 level or 2-7% faster, alternating in one process. On cuda the same selection ran
# whole PoseNet 5-10% slower (the gather's 17x17 1024->1024 layer is 152 us there already), so
# cuda keeps the gather; other archs with shared memory are unmeasured and keep it too.
SMALL_GRID_CONFIG = (32, 32, 2, 2)
SMALL_GRID_MIN_BLOCKS = 150
SMALL_GRID_ARCHS = frozenset({"vulkan"})


def gemm_min_blocks() -> int:
    """GEMM_MIN_BLOCKS; tests lower it (TFLITE_TAICHI_GEMM_MIN_BLOCKS) to reach the tiled
    kernel with shapes small enough for a software rasteriser."""
    given = switches.value("TFLITE_TAICHI_GEMM_MIN_BLOCKS")
    return GEMM_MIN_BLOCKS if given is None else given


def gemm_choice(m: int, n: int, k: int, arch: str):
    """The tile shape (tile_m, tile_n, micro_m, micro_n) a [m, k] @ [k, n] product runs with on
    Taichi arch `arch` (the step's StepIO.arch), or None for the register-tiled gather: an arch with
    block-shared memory, a reduction long enough to stage, and enough tiles of a measured class.
    TFLITE_TAICHI_GEMM_TILES forces one shape from gemm_min_blocks() tiles (bench/gemm_micro.py)."""
    if not kit.has_shared_memory(arch) or k < GEMM_K:
        return None
    forced = switches.value("TFLITE_TAICHI_GEMM_TILES")
    if forced:
        return forced if gemm_blocks(m, n, forced) >= gemm_min_blocks() else None
    if gemm_blocks(m, n, GEMM_CONFIG) >= gemm_min_blocks():
        return GEMM_CONFIG
    if arch in SMALL_GRID_ARCHS and gemm_blocks(m, n, SMALL_GRID_CONFIG) >= SMALL_GRID_MIN_BLOCKS:
        return SMALL_GRID_CONFIG
    return None

