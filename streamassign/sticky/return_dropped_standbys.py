"""Step 9 (return): a client that lost a previous standby to a client without state of it gets
it back where the load bounds allow (no standby state thrown away for a tie)."""

from __future__ import annotations

from ..shares import share_bounds
from .set_standby_targets import SetStandbyTargets


class ReturnDroppedStandbys(SetStandbyTargets):
    """The return step."""

    def _return_dropped_standbys(self, copies: list[int], placed: set[int]) -> None:
        """Give a client a previous standby it lost to a client with no state of that task,
        where balance allows: the holder stays at or above its load floor and the first client
        below its ceiling, or (when floors cannot all be met) the holder ends no further below
        its floor than the first was. Targets are set per client from counts, so a tie or the
        one-copy rule can give the ceiling to the wrong client; this repairs that after
        placement, and no standby state is thrown away for it. Passes in client order until
        one moves nothing (each move keeps one more copy of state, so that ends). Only copies
        placed in this run (``placed``) can lack state, so only their tasks are looked at."""
        lost = self._lost_standbys(copies, placed)
        if not lost:
            return
        r, clients, tasks = self.replicas, self.clients, self.tasks
        caps = [c.capacity for c in clients]
        load = [len(a) for a in self.active]
        for client in copies:
            if client >= 0:
                load[client] += 1
        bounds = share_bounds(sum(load), caps)
        again = True  # a holder that gave a copy back may now take one back itself
        while again:
            again = False
            for client in sorted(lost):
                floor, ceiling = bounds[client]
                if load[client] >= ceiling:
                    continue
                for task in lost[client]:
                    task_id = tasks[task]
                    held = copies[task * r : (task + 1) * r]
                    if client in held:
                        continue  # taken back in an earlier pass
                    for holder, k in sorted(zip(held, range(r), strict=True)):  # client order
                        if holder < 0 or clients[holder].has_state(task_id):
                            continue
                        if load[holder] > bounds[holder][0] or (
                            load[client] < floor
                            and bounds[holder][0] - (load[holder] - 1) <= floor - load[client]
                        ):
                            copies[task * r + k] = client
                            load[client] += 1
                            load[holder] -= 1
                            again = True
                            break
                    if load[client] >= ceiling:
                        break

    def _lost_standbys(self, copies: list[int], placed: set[int]) -> dict[int, list[int]]:
        """Per client, the tasks it held a standby of, lost, and now sees on a client without
        state of them (in task order)."""
        r, clients, tasks, owner = self.replicas, self.clients, self.tasks, self.owner
        warm = self.warm
        if not warm:
            return {}  # no client has state of any task (a fresh group)
        lost: dict[int, list[int]] = {}
        for task in sorted({slot // r for slot in placed} & warm.keys()):
            task_id = tasks[task]
            held = copies[task * r : (task + 1) * r]
            if all(holder < 0 or clients[holder].has_state(task_id) for holder in held):
                continue
            for client in warm[task]:
                if (
                    client != owner[task]
                    and client not in held
                    and task_id in clients[client].prev_standby
                ):
                    lost.setdefault(client, []).append(task)
        return lost
