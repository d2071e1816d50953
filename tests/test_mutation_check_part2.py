"""The mutation check's second half (the first and why there are two: tests/test_mutation_check.py)."""

from __future__ import annotations

import pytest

from test_mutation_check import check_part


@pytest.mark.full  # (minutes of pytest runs on copies of the project: the full tier)
def test_every_mutation_is_killed_by_its_tests_second_half() -> None:
    check_part(2)
