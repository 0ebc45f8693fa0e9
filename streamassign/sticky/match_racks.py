"""Step 6 (racks): cold tasks swap clients so more run in the rack of their partitions' leaders
(KIP-925 hints; counts unchanged)."""

from __future__ import annotations

from .keep_previous_tasks import KeepPreviousTasks


class MatchRacks(KeepPreviousTasks):
    """The rack-matching step."""

    def _match_racks(self, cold: list[int]) -> None:
        """Swap clients between cold tasks so more of them run in the rack of their partitions'
        leaders. Swaps keep every client's count; a swap happens only between a task off its
        rack and one whose client is in that rack while the task itself is not."""
        owner, clients, tasks = self.owner, self.clients, self.tasks
        wants = [self.task_racks.get(tasks[task]) for task in cold]
        # Per rack R: cold tasks of rack R running elsewhere, and cold tasks of another rack
        # running on a client in R (their slot is what a task of R wants).
        off: dict[str, list[int]] = {}
        slots: dict[str, list[int]] = {}
        for k, (task, want) in enumerate(zip(cold, wants, strict=True)):
            here = clients[owner[task]].rack
            if want is not None and want != here:
                off.setdefault(want, []).append(k)
            if here is not None and want != here:
                slots.setdefault(here, []).append(k)
        taken: set[int] = set()
        for rack in sorted(off):
            free = [k for k in slots.get(rack, ()) if k not in taken]
            for wanting in off[rack]:
                if wanting in taken:
                    continue
                while free and free[0] in taken:
                    free.pop(0)
                if not free:
                    break
                freed = free.pop(0)
                task, other_task = cold[wanting], cold[freed]
                owner[task], owner[other_task] = owner[other_task], owner[task]
                taken.update((wanting, freed))
