"""The storage contracts under faults (issue 36, "Done when": the fault harness runs the
consensus and blob contracts): `persistshard.conformance.storage`'s suites over stores whose
blob is wrapped in `persistshard.conformance.faults.FaultyBlob`, and the conformance probe's
own footprint."""

from __future__ import annotations

import pytest

from persistshard.conformance.crash import Cut, CutBlob
from persistshard.conformance.storage import probe_atomic_create
from persistshard.core.storage.blob import Blob, foreign_keys


@pytest.mark.parametrize("prefix", ["", "scratch/"])
def test_conformance_probe_cut_short_leaves_no_foreign_file(tmp_path, prefix):
    """The probe `persistshard conformance` runs first dies before it deletes its key (a
    crash): what it leaves must be a temporary inside the shard's own prefixes, never a
    foreign file that would refuse creating a shard there (it wrote ``probe-<uuid>``)."""
    location = str(tmp_path / "place")
    with pytest.raises(Cut):
        probe_atomic_create(CutBlob(Blob(location), cut_at=2), prefix=prefix)
    plain = Blob(location)
    assert foreign_keys(plain) == [] and plain.list("") == []
    left = [m.key for m in plain.list_temporary()]
    assert len(left) == 1 and left[0].startswith(f"{prefix}consensus/"), left
    probe_atomic_create(Blob(location), prefix=prefix)  # a complete probe leaves nothing new
    assert plain.list("") == [] and len(plain.list_temporary()) == 1
