"""An eighth review pass's breaks of secure aggregation (SECURITY.md, known breaks 16 and 17), run
against the real client state machines by a server that frames every stage itself.

16. Per-client cohort views (server alone, one round): the target was shown a cohort of three
    (threshold three) and everyone else one of nine; the three b shares of the target and the
    mask-key shares of its two peers, revealed by clients with other views, stripped its masked
    input. Fixed by binding every share to the cohort its dealer saw (a client with another view
    cannot open it) and, independently, by the consistency check.
17. Per-client survivor sets (server and one colluding client, one cohort for all): the target
    masked against the colluder and two peers only; other clients, told other survivor sets,
    revealed the peers' mask keys while enough revealed the target's self mask. Fixed by the
    consistency check: a client reveals only with ``t`` survivors' signatures over its own set.

18. (A ninth pass, after 16 and 17 were fixed.) Splitting the survivors into two groups that each
    confirm their own set took only ``2t - n`` colluders whatever ``min_cohort`` was: two at
    ``min_cohort`` 5 in a cohort of six, one at ``threshold_ratio`` 0.6. Fixed by a threshold with
    ``2t - n >= min_cohort - 1``.

20. (A tenth pass.) Each client computed the threshold from its own settings: a target at
    ``min_cohort`` 5 among clients at 3 was split with three colluders instead of four. Fixed: the
    adverts carry each member's settings, signed, and every member and the server use the
    strictest.

Each test runs the attack as it is refused today, then with the checks removed, where the server
gets the target's whole secure input (update, weight, loss, evaluation counts) to float64 rounding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
import torch
from torch import nn

from fedgat.federated import Client, FedAdam
from fedgat.pipeline import make_deployment
from fedgat.protocols import AuthError, PayloadError, ProtocolError
from fedgat.protocols import secagg as S
from fedgat.protocols.fedavg_client import ClientRounds, secure_vector, state_to_arrays
from fedgat.protocols.messages import GlobalModel
from fedgat.protocols.messages_secagg import (
    AdvertItem,
    Confirmation,
    SealedShare,
    SecAggCohort,
    SecAggRelay,
    SecAggSurvivors,
    SecAggUnmaskRequest,
)
from fedgat.protocols.party import Party
from fedgat.protocols.secagg import SecAggConfig
from fedgat.protocols.secagg_client import ClientSecAgg
from fedgat.synthetic import synthetic_graph
from fedgat.tasks import LocalTask

SESSION, ROUND = 9, 1


class Refused(Exception):
    """The attack stopped: ``party`` refused the ``stage`` message with ``error``."""

    def __init__(self, stage: str, party: int, error: ProtocolError) -> None:
        super().__init__(f"{stage}: party {party} refused: {error}")
        self.stage, self.party, self.error = stage, party, error


class HostileServer(Party):
    """Signs and frames what the attack below decides; handles nothing itself."""

    def _handler(self, msg):
        return None

    @property
    def done(self) -> bool:
        return False


def _federation(num: int, configs: Mapping[int, SecAggConfig]):
    graph = synthetic_graph(num_nodes=20 * num, num_features=12, train_per_class=8, num_val=4 * num,
                            num_test=6 * num, seed=5)  # fmt: skip
    torch.manual_seed(3)
    model = lambda: nn.Sequential(nn.Linear(graph.num_features, graph.num_classes))
    initial = model().state_dict()
    strategy = FedAdam(0.05, 5e-4, client_lr=0.5)
    dep = make_deployment(num)
    clients, truth = {}, {}
    for c in dep.roster.clients:
        nodes = np.flatnonzero(np.arange(graph.num_nodes) % num == c)
        targets = {}
        for split in ("train", "val", "test"):
            rows = torch.from_numpy(np.flatnonzero(getattr(graph, f"{split}_mask").numpy()[nodes]))
            targets[split] = (rows, graph.y[nodes][rows])
        task = LocalTask((graph.x[nodes],), targets)
        member = Client(c, model(), task, task, lr=0.05, local_epochs=2, strategy=strategy)
        fit = member.fit

        def recording(weights, fit=fit, c=c):
            truth[c] = fit(weights)
            return truth[c]

        member.fit = recording
        clients[c] = ClientRounds(c, dep.roster, SESSION, dep.identities[c], client=member, secagg=configs[c])
    return dep, clients, truth, initial


def split_views_attack(
    num: int,
    target: int,
    colluders: Sequence[int],
    views: Mapping[int, Sequence[int]],
    relays: Mapping[int, Sequence[int]],
    survivors: Mapping[int, Sequence[int]],
    config: SecAggConfig | Mapping[int, SecAggConfig] | None = None,
) -> float:
    """Run one secure round in which the server shows client ``c`` the cohort ``views[c]`` (default
    all), relays it the shares of ``relays[c]`` and tells it the survivors ``survivors[c]``, holding
    the ``colluders``' secrets and signing keys; then rebuild the target's self mask and its peers'
    mask keys from what was revealed and strip the target's masked input. ``config``: the clients'
    secure aggregation (default :class:`SecAggConfig`), or each client's.

    Returns:
        The largest error of the recovered secure input against the one the target encoded.

    Raises:
        Refused: a client refused a stage (the attack stops there).
    """
    config = SecAggConfig() if config is None else config
    configs = dict(config) if isinstance(config, Mapping) else dict.fromkeys(range(num), config)
    dep, clients, truth, initial = _federation(num, configs)
    roster = dep.roster
    server = HostileServer(roster.server, roster, SESSION, dep.identities[roster.server].signer)
    everyone = list(roster.clients)
    views = {c: sorted(views.get(c, everyone)) for c in everyone}

    def send(cls, c, stage, **fields):
        try:
            (answer,) = clients[c].receive(server.encode(server._new(cls, c, **fields)))
        except ProtocolError as exc:
            raise Refused(stage, c, exc) from None
        return answer

    arrays = state_to_arrays(initial)
    adverts = {}
    for c in everyone:
        a = send(GlobalModel, c, "model", round=ROUND, fit=True, splits=("val", "test"), arrays=arrays)
        adverts[c] = AdvertItem.of(a)
    dealt = {}
    for c in everyone:
        shares = send(SecAggCohort, c, "cohort", round=ROUND, adverts=tuple(adverts[v] for v in views[c]))
        dealt[c] = {s.party: s.sealed for s in shares.shares}
    masked = {}
    for c in everyone:
        source = sorted(relays.get(c, [v for v in views[c] if v != c and c in dealt[v]]))
        answer = send(
            SecAggRelay, c, "relay", round=ROUND, shares=tuple(SealedShare(u, dealt[u][c]) for u in source)
        )
        masked[c] = answer.masked.view(np.uint64)
    held = {c: clients[c]._secure for c in colluders}
    held = {c: (dict(s.received), s.s_seed, s.view) for c, s in held.items()}
    confirms: dict[tuple, list[Confirmation]] = {}
    for c, surv in survivors.items():
        answer = send(SecAggSurvivors, c, "survivors", round=ROUND, survivors=tuple(sorted(surv)))
        confirms.setdefault((tuple(sorted(surv)), clients[c]._secure.view), []).append(
            Confirmation(c, answer.confirmation)
        )
    reveals = {}
    for c, surv in survivors.items():
        key = (tuple(sorted(surv)), clients[c]._secure.view)
        mine = {x.party: x for x in confirms[key]}
        for colluder, (_, _, view) in held.items():  # a colluder signs whatever set is asked
            data = S.confirm_bytes(SESSION, ROUND, colluder, view, key[0])
            mine.setdefault(colluder, Confirmation(colluder, dep.identities[colluder].signer.sign(data)))
        confirmations = tuple(mine[p] for p in sorted(mine) if p in key[0])
        reveals[c] = send(
            SecAggUnmaskRequest, c, "unmask", round=ROUND, survivors=key[0], confirmations=confirmations
        )

    index = {c: {v: i + 1 for i, v in enumerate(views[c])} for c in everyone}
    dealt_with = {c: clients[c]._secure.threshold for c in everyone}

    def rebuild(kind: str, party: int, ok) -> bytes | None:
        k = 1 if kind == "b_shares" else 0
        shares = [
            (index[party][h], s.share)
            for h, r in reveals.items()
            for s in getattr(r, kind)
            if s.party == party
        ]
        shares += [(index[party][c], rec[party][k]) for c, (rec, _, _) in held.items() if party in rec]
        t = dealt_with[party]  # what the dealer's settings give (public: its advert carries them)
        return next((x for x in map(S.combine_shares, itertools.combinations(shares, t)) if ok(x)), None)

    def s_ok(p: int):
        return lambda seed: S.public_bytes(S.mask_key(seed, SESSION, ROUND, p)) == adverts[p].s_pk

    b_t = rebuild(
        "b_shares", target, lambda s: S.b_commitment(s, SESSION, ROUND, target) == adverts[target].b_commit
    )
    assert b_t is not None, "the target's self mask was not rebuilt"
    peers = sorted(relays.get(target, [v for v in views[target] if v != target]))
    own = rebuild("s_shares", target, s_ok(target))  # its own mask key gives every pair mask
    pairs = {}  # peer -> (a private key, the other side's public key)
    for p in peers:
        if own is not None:
            pairs[p] = (S.mask_key(own, SESSION, ROUND, target), adverts[p].s_pk)
        elif p in held:
            pairs[p] = (S.mask_key(held[p][1], SESSION, ROUND, p), adverts[target].s_pk)
        else:
            seed = rebuild("s_shares", p, s_ok(p))
            assert seed is not None, f"neither the target's mask key nor party {p}'s was rebuilt"
            pairs[p] = (S.mask_key(seed, SESSION, ROUND, p), adverts[target].s_pk)
    m = masked[target].shape[1]
    x = S.ring_sub(masked[target], S.self_mask(b_t, SESSION, ROUND, target, m))
    for v, (key, public) in pairs.items():
        mask = S.pair_mask(key, public, SESSION, ROUND, v, target, adverts[target].model_digest, m)
        x = S.ring_sub(x, mask) if target < v else S.ring_add(x, mask)
    member = clients[target].client
    counts = member.evaluate(clients[target].global_weights, ("val", "test"))
    want = secure_vector(truth[target], initial, counts)
    return float(np.abs(S.decode(x) - want).max())


def _no_view_binding(monkeypatch) -> None:
    monkeypatch.setattr("fedgat.protocols.secagg_client.cohort_view", lambda adverts: bytes(32))


def _no_consistency_check(monkeypatch) -> None:
    monkeypatch.setattr(ClientSecAgg, "_check_confirmations", lambda self, msg, roster: None)


def cohort_views_attack() -> float:
    """Break 16: nine clients, the target 0 shown {0, 1, 2} (n = 3, t = 3), everyone else all nine
    (t = 6); the target gets the shares of 1 and 2, 1 and 2 everyone's, 3-8 those of 1, 2 and each
    other; 0-2 count the target as a survivor, 3-8 count 1 and 2 as dropped."""
    target, peers, rest = 0, [1, 2], list(range(3, 9))
    return split_views_attack(
        9,
        target,
        (),
        views={target: [target, *peers]},
        relays={target: peers, **{q: [*peers, *(v for v in rest if v != q)] for q in rest}},
        survivors={target: [target, *peers], **dict.fromkeys(peers, range(9)), **dict.fromkeys(rest, rest)},
    )


def test_cohort_views_per_client_are_refused(monkeypatch):
    """FIXED (break 16, frame version 11): the target cannot open shares dealt under another cohort;
    with that binding removed the consistency check still stops it (its two peers sign another
    survivor set); with both removed the server gets the target's input in one round."""
    with pytest.raises(Refused) as info:
        cohort_views_attack()
    assert (info.value.stage, info.value.party) == ("relay", 0) and isinstance(info.value.error, AuthError)

    _no_view_binding(monkeypatch)
    with pytest.raises(Refused) as info:
        cohort_views_attack()
    assert (info.value.stage, info.value.party) == ("unmask", 0)
    assert isinstance(info.value.error, PayloadError) and "below the threshold" in str(info.value.error)

    _no_consistency_check(monkeypatch)
    assert cohort_views_attack() <= 1e-9


def survivor_sets_attack() -> float:
    """Break 17: six clients, one cohort (t = 4), client 1 colluding; the target 0 gets the shares of
    1, 2 and 3 only; survivors: 0 is told {0, 1, 2, 3}, 2 all but 3, 3 all but 2, 4 and 5 {0, 1, 4, 5}."""
    return split_views_attack(
        6,
        0,
        (1,),
        views={},
        relays={0: [1, 2, 3]},
        survivors={0: [0, 1, 2, 3], 2: [0, 1, 2, 4, 5], 3: [0, 1, 3, 4, 5], 4: [0, 1, 4, 5], 5: [0, 1, 4, 5]},
    )


def test_survivor_sets_per_client_are_refused(monkeypatch):
    """FIXED (break 17, frame version 11): the target's survivor set gets two confirmations (its own
    and the colluder's), below t = 4, and it reveals nothing; with the consistency check removed the
    server and one colluder get the target's input in one round."""
    with pytest.raises(Refused) as info:
        survivor_sets_attack()
    assert (info.value.stage, info.value.party) == ("unmask", 0)
    assert "2 survivors confirmed" in str(info.value.error)

    _no_consistency_check(monkeypatch)
    assert survivor_sets_attack() <= 1e-9


def _old_threshold(self, n: int) -> int:
    """The threshold before the ninth pass: no term for ``min_cohort``."""
    return min(n, max(3, math.ceil(self.threshold_ratio * n - 1e-9)))


SPLITS = {
    # min_cohort 5 (a Flower node's min-cohort 5), six clients, colluders 4 and 5: t was 4, now 5
    "min_cohort_5": (
        6,
        (4, 5),
        SecAggConfig(min_cohort=5),
        {0: range(6), 1: range(6), 2: [1, 2, 3, 4, 5], 3: [1, 2, 3, 4, 5]},
    ),
    # ratio 0.6, five clients, one colluder: t was 3, now 4
    "ratio_0.6": (
        5,
        (4,),
        SecAggConfig(threshold_ratio=0.6),
        {0: range(5), 1: range(5), 2: [1, 2, 3, 4], 3: [1, 2, 3, 4]},
    ),
}


@pytest.mark.parametrize("case", sorted(SPLITS))
def test_splitting_the_survivors_takes_as_many_colluders_as_min_cohort_does(case, monkeypatch):
    """FIXED (break 18): the target's group (0, 1) confirms the whole cohort and reveals the target's
    self mask, the other group (2, 3) confirms the cohort without the target and reveals its mask
    key; the colluders sign both sets. With ``t >= (n + min_cohort - 1) / 2`` neither group reaches
    ``t`` confirmations; with the threshold as it was the server reads the target's input."""
    num, colluders, config, survivors = SPLITS[case]

    def attack() -> float:
        return split_views_attack(num, 0, colluders, views={}, relays={}, survivors=survivors, config=config)

    assert 2 * config.threshold(num) - num >= config.min_cohort - 1 >= len(colluders)
    with pytest.raises(Refused) as info:
        attack()
    assert info.value.stage == "unmask" and "below the threshold" in str(info.value.error)

    monkeypatch.setattr(SecAggConfig, "threshold", _old_threshold)
    assert attack() <= 1e-9


def test_a_cohort_runs_under_its_strictest_members_settings(monkeypatch):
    """FIXED (break 20): six clients in one cohort, the target 0 at ``min_cohort`` 5 (t = 5), the
    others at 3 (t = 4), colluders 3, 4, 5: 0 and 1 confirm {0, 1, 3, 4, 5} and reveal the target's
    self mask and 2's mask key, 2 confirms {2, 3, 4, 5} (four confirmations, its own t) and reveals
    1's mask key. Now every member computes t = 5 from the adverts' settings and 2 refuses; with each
    client on its own settings the server and three colluders read the target's input."""
    configs = {0: SecAggConfig(min_cohort=5), **{c: SecAggConfig() for c in range(1, 6)}}
    survivors = {0: [0, 1, 3, 4, 5], 1: [0, 1, 3, 4, 5], 2: [2, 3, 4, 5]}

    def attack() -> float:
        return split_views_attack(6, 0, (3, 4, 5), views={}, relays={}, survivors=survivors, config=configs)

    with pytest.raises(Refused) as info:
        attack()
    assert (info.value.stage, info.value.party) == ("survivors", 2)
    assert "below the threshold 5" in str(info.value.error)

    monkeypatch.setattr(ClientSecAgg, "_threshold", lambda self, adverts: self.config.threshold(len(adverts)))
    assert attack() <= 1e-9
