"""One assignment, every step in order (``result``)."""

from __future__ import annotations

from ..assignment import ClientAssignment
from .keep_stable_history import KeepStableHistory


class _Run(KeepStableHistory):
    """State of one assignment; tasks and clients are referred to by index in sorted order."""

    def result(self, fast_path: bool = True) -> dict[str, ClientAssignment]:
        if fast_path:
            stable = self._history_if_stable()
            if stable is not None:
                return stable
        self.warm = self._warm_holders(self.lost)
        self.assign_actives()
        self.assign_standbys()
        task_id = self.tasks.__getitem__
        return {
            state.process_id: ClientAssignment(
                active=frozenset(map(task_id, self.active[client])),
                standby=frozenset(map(task_id, self.standby[client])),
            )
            for client, state in enumerate(self.clients)
        }
