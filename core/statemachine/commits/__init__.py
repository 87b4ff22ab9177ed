"""persistshard.core.statemachine.commits: every commit kind, one module each.

- `base`: `Commit`, the envelope every kind shares (id, time, metrics, the stored form),
  the registry of kinds (`KINDS`, filled by declaring a subclass) and `apply`.
- `append` (`Append`): updates at the upper, seals, streaming micro-batches.
- `compact` (`Compact`): consecutive trace batches replaced by one.
- `advance_since` (`AdvanceSince`): since moves forward as far as live holds allow.
- `register_reader`, `downgrade_since`, `heartbeat`, `expire_reader`: reader holds.
- `renew_lease` (`RenewLease`), `sweep_leases` (`SweepLeases`): write leases and gc's fence.
- `set_retention` (`SetRetention`): the history retention.
- `append_set_retention` (`AppendSetRetention`): an append that also sets the retention
  (a Spark write's option ``retention``), in one commit.
- `create_consumer`, `advance_consumer`, `drop_consumer`: durable consumers.

Each kind's module states its precondition and effect, and holds its typed fields, its
stored arguments, its transition and its history summary. Importing this package imports
every module in it, so a kind is registered by adding its module here and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from persistshard.core.statemachine.commits.base import KINDS, Commit, apply

__all__ = ["KINDS", "Commit", "apply"]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
