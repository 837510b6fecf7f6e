"""The op cases the tests share: one module per op family (hypothesis strategies,
one-op model builders). Test files import cases from here, never from each other."""


class Data:
    """`st.data()` inside an `@st.composite` case strategy: `data.draw(strategy, label=...)` is
    the composite's `draw(strategy)` (the labels name draws in hypothesis' reports only)."""

    def __init__(self, draw):
        self._draw = draw

    def draw(self, strategy, label=None):
        return self._draw(strategy)
