"""The mutation check's second half (the first and why there are two: tests/test_mutation_check.py)."""

from __future__ import annotations

from test_mutation_check import check_part


def test_every_mutation_is_killed_by_its_tests_second_half() -> None:
    check_part(2)
