"""A family's case tables. `Row`: one row per property test of the delegate, each row a strategy
of check_op cases (one op in one dtype, or ops drawn together), so that one parametrised test
per family runs every row on every Taichi worker against the reference path. `Refused`: one
fixed model the delegate must leave on the CPU, with the reason it must give, so that one
parametrised test per family checks every refusal (check_refused)."""
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

from hypothesis.strategies import SearchStrategy

from tflite_taichi.testing import check_delegate


@dataclass(frozen=True)
class Row:
    """`cases` draws check_op's (model, inputs[, options]); `id` names the row's test;
    `covers` says what the draws reach beyond plain shapes."""
    id: str
    cases: SearchStrategy
    covers: str = ""


def row_id(row: Row) -> str:
    return row.id


@dataclass(frozen=True)
class Refused:
    """`model` (bytes, or a callable building them: it may assert what the model is meant to
    show) runs on the workers and the reference path with `inputs` (None: seeded by `seed`).
    The ops left on the CPU are exactly `on_cpu` (one op name, or the names in op order), each
    reason containing `reason`; `delegated` ops run on the delegate, and `folded` ops are folded
    at prepare (None: not checked). `one_worker`: the first worker only."""
    name: str
    model: Union[bytes, Callable[[], bytes]]
    on_cpu: Union[str, Tuple[str, ...]]
    reason: str
    inputs: Optional[Sequence] = None
    seed: int = 0
    delegated: int = 0
    folded: Optional[int] = None
    one_worker: bool = False


def refused_id(case: Refused) -> str:
    return case.name


def check_refused(case: Refused, workers) -> None:
    """The outputs match the reference (check_delegate) and every worker's summary shows the
    refusal `case` describes."""
    model = case.model() if callable(case.model) else case.model
    workers = list(workers)[:1] if case.one_worker else workers
    summaries = check_delegate(model, workers, case.inputs, seed=case.seed,
                               expect_all_delegated=False)
    assert summaries, f"{case.name}: no worker ran"
    on_cpu = (case.on_cpu,) if isinstance(case.on_cpu, str) else tuple(case.on_cpu)
    for backend, summary in summaries.items():
        where = f"{case.name} on {backend}"
        fallback = summary["fallback"]
        assert summary["ops_delegated"] == case.delegated, \
            f"{where}: {summary['ops_delegated']} ops delegated, not {case.delegated}; " \
            f"left on the CPU: {fallback}"
        assert tuple(f["op"] for f in fallback) == on_cpu, \
            f"{where}: left on the CPU {fallback}, not {list(on_cpu)}"
        for f in fallback:
            assert case.reason in f["reason"], \
                f"{where}: {f['op']}'s reason {f['reason']!r} does not say {case.reason!r}"
        if case.folded is not None:
            assert summary["ops_folded"] == case.folded, \
                f"{where}: {summary['ops_folded']} ops folded, not {case.folded}"
