"""Errors that mean "the tool could not run" (exit 2), as opposed to a failed check (exit 1)."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: a file or setting the tool cannot use. Rendered as one line, exit 2."""

    def __init__(self, where: object, problem: str):
        self.where = str(where)
        self.problem = problem
        super().__init__(f"{self.where}: {problem}")
