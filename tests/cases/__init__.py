"""The op cases the tests share: one module per op family (hypothesis strategies,
one-op model builders). Test files import cases from here, never from each other."""

