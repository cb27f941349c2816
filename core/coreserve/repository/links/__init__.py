"""Models linked through ensembles: an ensemble goes down with a model it uses (or when one,
reloaded, no longer fits it) and comes back with it (`TakenDownEnsembles`), an ensemble loads
again with a model it uses (`LinkedReloads`), and changes of linked models wait for each other
(`RelatedChanges`)."""

from __future__ import annotations

from coreserve.repository.links._changes import RelatedChanges, linked
from coreserve.repository.links._reloads import LinkedReloads
from coreserve.repository.links._taken_down import TakenDownEnsembles, not_available

__all__ = ["LinkedReloads", "RelatedChanges", "TakenDownEnsembles", "linked", "not_available"]
