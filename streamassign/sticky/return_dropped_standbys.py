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
        r, clients, tasks, owner = self.replicas, self.clients, self.tasks, self.owner
        # Per client, the tasks it held a standby of, lost, and now see on a client without
        # state of them (in task order).
        warm = self.warm
        if not warm:
            return  # no client has state of any task (a fresh group)
        lost: dict[int, list[int]] = {}
        for i in sorted({slot // r for slot in placed} & warm.keys()):
            t = tasks[i]
            held = copies[i * r : (i + 1) * r]
            if all(d < 0 or clients[d].has_state(t) for d in held):
                continue
            for ci in warm[i]:
                if ci != owner[i] and ci not in held and t in clients[ci].prev_standby:
                    lost.setdefault(ci, []).append(i)
        if not lost:
            return
        caps = [c.capacity for c in clients]
        load = [len(a) for a in self.active]
        for ci in copies:
            if ci >= 0:
                load[ci] += 1
        bounds = share_bounds(sum(load), caps)
        again = True  # a holder that gave a copy back may now take one back itself
        while again:
            again = False
            for ci in sorted(lost):
                floor, ceiling = bounds[ci]
                if load[ci] >= ceiling:
                    continue
                for i in lost[ci]:
                    t = tasks[i]
                    held = copies[i * r : (i + 1) * r]
                    if ci in held:
                        continue  # taken back in an earlier pass
                    for d, k in sorted(zip(held, range(r), strict=True)):  # client order
                        if d < 0 or clients[d].has_state(t):
                            continue
                        if load[d] > bounds[d][0] or (
                            load[ci] < floor and bounds[d][0] - (load[d] - 1) <= floor - load[ci]
                        ):
                            copies[i * r + k] = ci
                            load[ci] += 1
                            load[d] -= 1
                            again = True
                            break
                    if load[ci] >= ceiling:
                        break
