"""The sticky task assignor: active and standby tasks over clients, balanced and minimal-move.

The algorithm (DESIGN §3), in order of precedence:

1. **Quotas.** Balanced per subtopology (``balance="subtopology"``, the default): a quota per
   (client, subtopology), the floor or ceiling of its capacity-proportional share, with row
   totals within floor and ceiling of the client's total share; ``compute_quotas.best_quotas`` picks
   the matrix that keeps the most previous tasks (an exact min-cost flow), and each
   subtopology then goes through steps 2-4 on its own. With ``balance="total"``: each client's
   total quota is the floor or ceiling of its share; the ceilings go to the clients that ran
   the most tasks above their floor. Either choice makes the moves minimal for its balance.
2. **Stickiness.** Every client keeps ``min(K_c, q_c)`` of the tasks it ran, so moves equal the
   lower bound exactly. A client over quota releases tasks of its most crowded subtopologies
   first, and among those the ones another client holds warm state for.
3. **Warm takeovers.** A task without a keeper goes to a client with room that holds a standby
   of it, else to the one with the smallest lag; when all its holders are full, a chain of
   this rebalance's takeovers shifts along holders to one with room (``chain_takeovers``).
4. **Spread.** The rest are dealt in ``(subtopology, partition)`` order over the clients' free
   room, evenly interleaved, so a subtopology is spread over clients.
5. **Standbys.** Every stateful task gets ``min(num_standby_replicas, clients - 1)`` standbys on
   clients without a copy of it. Targets bring each client's active+standby load to the floor or
   ceiling of its share (as far as one copy per client allows); previous standbys (then other
   local state, lowest lag first) are kept, those of tasks active on clients that take new
   standbys first; the rest go to the clients with most room left, those tasks first again,
   with a one-step swap when the only clients with room already hold the task. Balanced per
   subtopology, exchanges of new standbys then even out each client's standbys per subtopology.

All decisions iterate in sorted order of task and process ids, so the same input gives the same
output whatever the order of the input collections.

Where each step lives (``docs/assignor.md``, "Where each step lives"): ``resolve_claims``,
``rank_warm_holders``, ``compute_quotas``, ``balance_totals`` / ``balance_subtopologies``,
``keep_previous_tasks``, ``place_orphans`` (with ``chain_takeovers`` and ``deal_tasks``),
``match_racks``, ``set_standby_targets``, ``place_standbys`` (with ``pick_standby_clients``),
``return_dropped_standbys``, ``exchange_for_racks``, ``even_standbys``; ``run_state`` holds the
state they share, ``run`` runs them in order, ``assignor`` is the public entry point.

Public names: ``StickyTaskAssignor``; ``Balance`` and ``BALANCE_MODES`` (the ``balance``
choices); ``resolve_previous_owners`` (step 2's claim resolution, also used by the HA
assignor); and the two option helpers every assignor with these options shares (the HA
assignor uses them), so the options behave the same everywhere: ``balance_option``, the attrs
validator of ``balance`` (an ``AssignmentInputError`` naming the choices for any other value),
and ``tag_keys_option``, the attrs converter of ``rack_aware_tags`` (any iterable of tag keys to
a tuple; ``None`` stays ``None``: every tag key clients report).
"""

# Public names only; tests that drive one step import it from its defining submodule.
from .assignor import BALANCE_MODES, Balance, StickyTaskAssignor, balance_option, tag_keys_option
from .resolve_claims import resolve_previous_owners

__all__ = [
    "BALANCE_MODES",
    "Balance",
    "StickyTaskAssignor",
    "balance_option",
    "resolve_previous_owners",
    "tag_keys_option",
]
