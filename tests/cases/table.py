"""A family's case table: one row per property test of the delegate, each row a strategy of
check_op cases (one op in one dtype, or ops drawn together), so that one parametrised test per
family runs every row on every Taichi worker against the reference path."""
from dataclasses import dataclass

from hypothesis.strategies import SearchStrategy


@dataclass(frozen=True)
class Row:
    """`cases` draws check_op's (model, inputs[, options]); `id` names the row's test;
    `covers` says what the draws reach beyond plain shapes."""
    id: str
    cases: SearchStrategy
    covers: str = ""


def row_id(row: Row) -> str:
    return row.id
