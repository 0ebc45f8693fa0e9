"""Steps 2-6 together: the actives, by either balance mode; previous owners that gave a task up
become warm holders for the standby steps."""

from __future__ import annotations

from functools import partial

from .balance_subtopologies import BalanceSubtopologies


class AssignActives(BalanceSubtopologies):
    """Every task's active client."""

    def assign_actives(self) -> None:
        if self.by_subtopology:
            self._actives_per_subtopology()
        else:
            self._actives_by_total()
        owner, warm = self.owner, self.warm
        for task, client in enumerate(owner):
            self.active[client].append(task)
        # A previous owner that gave its task up still holds its state: a fine standby.
        for task, (was, now) in enumerate(zip(self.prev_owner, owner, strict=True)):
            if was >= 0 and was != now and was not in warm.get(task, ()):
                found = warm.setdefault(task, [])
                found.append(was)
                found.sort(key=partial(self._rank, task))
