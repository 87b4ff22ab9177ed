"""The location a conformance run checks, handed to pytest as a plugin object.

``persistshard conformance LOCATION`` runs `persistshard.conformance.run_suite` with
``pytest.main(..., plugins=[ConformanceTarget(...)])``: the plugin's ``conformance_target``
fixture gives every test the location, the storage options (credentials included), the
consensus URL and the run's id. Nothing travels through the environment or a module global,
so secrets never reach ``os.environ`` (and so no child process inherits them), and two runs
in one process never see each other's target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from persistshard.conformance.cleanup import scratch_name

__all__ = ["ConformanceTarget"]


@dataclass(frozen=True)
class ConformanceTarget:
    """Where the suite runs: ``location`` (every test gets a fresh ``conformance-<run>-<uuid>``
    under it, `fresh`), the blob store's ``storage_options`` (``repr`` hides them),
    ``consensus`` (a database URL keeping the log, or None: next to the data) and ``run``
    (the id the command's clean-up removes by, `persistshard.conformance.cleanup`)."""

    location: str
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    consensus: str | None = None
    run: str = ""

    def fresh(self) -> str:
        """A new, empty sub-location of this run."""
        return f"{self.location.rstrip('/')}/{scratch_name(self.run)}"

    @pytest.fixture(name="conformance_target")
    def conformance_target(self) -> ConformanceTarget:
        """This target, for the suite's tests (a fixture of the plugin object)."""
        return self
