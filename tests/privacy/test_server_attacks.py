"""Attacks by a hostile server (alone or with a colluding client) against the real protocol, on a
small graph: each outcome is measured, and the checks are not blind (the same read-outs recover
what they should where the protocol allows it)."""

import re

import numpy as np
import pytest

from fedgat.audit import SERVER_ATTACKS, audit_server
from fedgat.partition import make_partition
from fedgat.pipeline import run_plaintext_pretraining
from fedgat.server_attacks import (
    FORGERIES,
    AttackSetting,
    chosen_bases_attack,
    colluder_forgery_attack,
    dropped_client_attack,
    fake_edges_attack,
    forged_results_attacks,
    relabel_forgery_attack,
    row_swap_attack,
    split_roster_attack,
    statements_unchecked,
    third_party_claims_attack,
    withheld_claim_target,
    withheld_claims_attack,
)
from fedgat.synthetic import synthetic_graph
from fedgat.training_attacks import TrainingSetting, digest_binding_check, training_attacks, unmix


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(num_nodes=400, num_features=16, avg_degree=4.0, seed=3)


@pytest.fixture(scope="module")
def setting(graph):
    return AttackSetting(graph, make_partition(graph, 3, beta=1.0, seed=0), "vector", seed=1)


@pytest.fixture(scope="module")
def forged(setting):
    return forged_results_attacks(setting)


@pytest.mark.parametrize("name", ["substituted_result", "injected_ciphertexts"])
def test_forged_results_are_refused_before_training(forged, name):
    """Every forged result (another owner's single row, other coefficients, another node's
    combination; chosen plaintexts under the victim's key; a ciphertext of the attacker's own key
    re-enveloped) is refused by its victim's tag check, naming the node and the owner; the victim
    aborts and never completes, so nothing forged is trained on."""
    out = forged[name]
    d = out.as_dict()
    kinds = [f["kind"] for f in d["forged"]]
    assert sorted(kinds) == sorted(k for k, a in FORGERIES.items() if a == name)  # one per kind
    assert all(f["refused"] and not f["victim_completed"] for f in d["forged"])
    assert all(len(f["owners"]) == 1 for f in d["forged"])  # partials: one owner's rows
    assert out.detected and out.recovered == 0 and d["recovered_fraction"] == 0.0


def test_server_and_one_client_cannot_forge_an_honest_owners_partial(setting):
    """The colluder's check keys predict nothing of another owner's partial: refused, victim aborted."""
    out = colluder_forgery_attack(setting)
    d = out.as_dict()
    assert out.ran and out.targets == 1 and out.recovered == 0 and out.detected
    assert d["owner"] not in (d["colluder"], d["victim"]) and d["victim_completed"] is False


def test_forgeries_on_a_server_pool_hit_their_victims_and_are_refused(graph):
    """With the server's work on a process pool its recipients come interleaved: the forging server
    still finds each forged result's recipient by its plan position (not by the count of results
    so far), every forgery reaches its victim and is refused there, and so is the colluder's."""
    setting = AttackSetting(graph, make_partition(graph, 3, beta=1.0, seed=0), "vector", seed=1, workers=2)
    out = forged_results_attacks(setting)
    for name in ("substituted_result", "injected_ciphertexts"):
        d = out[name].as_dict()
        assert sorted(f["kind"] for f in d["forged"]) == sorted(k for k, a in FORGERIES.items() if a == name)
        assert all(f["refused"] and not f["victim_completed"] for f in d["forged"])
        assert out[name].detected and out[name].recovered == 0
    colluder = colluder_forgery_attack(setting)
    assert colluder.ran and colluder.detected and colluder.recovered == 0


def test_a_clients_upload_of_another_owners_node_is_refused_by_the_server(forged):
    upload = forged["injected_ciphertexts"].as_dict()["client_upload"]
    assert upload["refused_by_server"] is True
    assert upload["owner"] not in (upload["colluder"], upload["recipient"])
    assert f"party {upload['colluder']} uploads node {upload['node']}" in upload["error"]


def test_fake_edges_are_refused_and_release_nothing(setting):
    out = fake_edges_attack(setting, fakes=6)
    d = out.as_dict()
    honest, blind = d["runs"]["honest_server"], d["runs"]["claim_blind_server"]
    assert honest["server_refused"] and "does not confirm" in honest["server_error"]
    assert honest["rows_released_to_colluder"] == 0
    # a server that skips its check: the owners still release no row for the fake edges ...
    assert blind["rows_released_for_fake_targets"] == 0 and blind["rows_released_beyond_honest_view"] == 0
    # ... while the colluder's honest rows decrypt (the scan is not blind)
    assert blind["rows_released_to_colluder_recovered"] == blind["rows_released_to_colluder"] > 0
    assert out.targets == 6 and out.recovered == 0 and out.detected


def test_claims_over_third_clients_nodes_release_nothing(setting):
    """A colluder claims, as its own, the far ends of honest owners' real edges to third clients: the
    honest server refuses; with one that skips its check, the owners release only the colluder's
    honest rows (they check who owns the other end of their edge themselves)."""
    out = third_party_claims_attack(setting)
    d = out.as_dict()
    honest, blind = d["runs"]["honest_server"], d["runs"]["claim_blind_server"]
    assert d["claims"] > 0 and out.targets > 0
    assert honest["server_refused"] and honest["rows_released_to_colluder"] == 0
    assert blind["rows_released_beyond_honest_view"] == 0
    assert blind["rows_released_to_colluder_recovered"] == blind["rows_released_to_colluder"] > 0
    assert out.recovered == 0 and out.detected


def test_owners_that_trust_the_claimers_word_release_third_clients_neighbours(setting, monkeypatch):
    """The attack has teeth: owners whose release rule takes any of their cross edges as the
    claimer's (the rule before the red-team fix) give the colluder rows beyond its honest view."""
    import dataclasses

    from fedgat.protocols import pretrain_client

    real = pretrain_client.releases

    def owner_blind(me, local, claims, recipients):
        if not dataclasses.is_dataclass(local):  # the colluder's own (wrapped) graph
            return real(me, local, claims, recipients)
        out = {}
        for a in recipients:  # every cross edge taken as one to a node of a
            out.update(
                real(me, dataclasses.replace(local, cross_owner=np.full(len(local.cross), a)), claims, [a])
            )
        return out

    monkeypatch.setattr(pretrain_client, "releases", owner_blind)
    out = third_party_claims_attack(setting)
    blind = out.as_dict()["runs"]["claim_blind_server"]
    assert blind["rows_released_beyond_honest_view"] > 0 and out.recovered > 0


def test_a_foreign_neighbour_relabelled_as_the_colluders_is_refused(setting):
    """Known break 9: the server labels an honest owner's row in a foreign node's neighbourhood as
    its colluder's and sends that partial with a chosen row under the colluder's tags. The victim
    refuses the bases (its owner's signed claims say otherwise) and never completes."""
    out = relabel_forgery_attack(setting)
    d = out.as_dict()
    assert out.ran and d["true_owner"] not in (d["victim"], d["colluder"])
    assert out.detected and out.recovered == 0 and not d["victim_completed"]
    assert "signed claims do not say" in d["victim_error"]


def test_without_the_check_the_victim_trains_on_the_forged_row(setting, monkeypatch):
    """The attack has teeth: a recipient that does not check its foreign nodes' neighbourhoods (the
    code before the fix) completes on the forged partial."""
    from fedgat.protocols import pretrain_client

    monkeypatch.setattr(pretrain_client, "check_foreign_neighbourhoods", lambda *a, **k: None)
    out = relabel_forgery_attack(setting)
    assert out.recovered == 1 and not out.detected and out.as_dict()["forged_results_sent"] >= 1


def test_an_owners_rows_swapped_in_a_foreign_neighbourhood_are_refused(setting):
    """Known break 5, by the server alone: in one victim's bases it puts another row of a foreign
    node's owner (released to the victim for another node) in place of one of that node's own
    neighbours, and computes the owner's partial over the swapped neighbourhood. The swapped row
    carries the owner's tags for itself; the owner's signed statement of the neighbourhood shows the
    swap, and the victim refuses the bases and never completes."""
    out = row_swap_attack(setting)
    d = out.as_dict()
    assert out.ran and d["positions_swapped"] == 1 and d["swapped_in"] != d["swapped_out"]
    assert out.detected and out.recovered == 0 and not d["victim_completed"]
    assert f"another neighbourhood than party {d['owner']}'s signed statement" in d["victim_error"]


def test_without_the_statements_the_victim_completes_on_the_swapped_row(setting):
    """The attack has teeth: with every other check in place but the owners' statements agreeing
    with whatever the bases say, the victim completes, its encoding of the node off the honest one."""
    with statements_unchecked():
        out = row_swap_attack(setting)
    d = out.as_dict()
    assert out.recovered == 1 and not out.detected and d["victim_completed"]
    assert d["victim_encoding_error"] > 1e-3


@pytest.mark.parametrize("mode", ["drop", "keep_one"])
def test_bases_off_the_variants_identity_are_refused(setting, mode):
    """A sixth review pass: the server drew bases that drop, merge, scale or isolate neighbours' rows
    and computed every result honestly for them, so every tag check passed and every client
    completed. Each client now checks the identity on random probes and refuses the bases."""
    out = chosen_bases_attack(setting, mode)
    d = out.as_dict()
    assert out.detected and out.recovered == 0 and d["clients_refused"] == [0, 1, 2]
    assert "do not read their neighbours' rows back" in d["first_error"]


def test_without_the_basis_check_every_client_trains_on_rows_the_server_chose(setting, monkeypatch):
    from fedgat.protocols import pretrain_checks

    monkeypatch.setattr(pretrain_checks, "check_basis_identity", lambda *a, **k: None)
    out = chosen_bases_attack(setting, "scale")
    assert out.recovered == 3 and not out.detected and out.as_dict()["read_back_error"] > 0.5


def test_an_honest_rounds_encodings_read_the_true_rows_back(setting):
    """The read-back the attack measures is a real quantity: exact up to CKKS noise when honest."""
    from fedgat.server_attacks import _read_back_error, honest_round

    parties = honest_round(setting)
    assert all(_read_back_error(c.encodings, setting.truth) < 1e-5 for c in parties.clients.values())


def test_a_withheld_claim_is_refused_at_the_roster(setting):
    """The server does not relay one claim of an owner the victim borders: the victim refuses the
    roster (every claim names its claimer's peers, signed) and never completes; without that check
    it goes on (a review used the gap to swap rows in foreign neighbourhoods unseen)."""
    out = withheld_claims_attack(setting)
    d = out.as_dict()
    assert out.ran and out.detected and out.recovered == 0 and not d["victim_completed"]
    assert not d["victim_accepted_roster"]
    assert (
        f"withheld party {d['withheld'][0]}'s claims of its edges to parties [{d['withheld'][1]}]"
        in d["victim_error"]
    )


def test_a_bordering_owners_claim_to_the_victim_itself_cannot_be_withheld(setting):
    """A sixth review pass withheld D's claim *to the victim* (the check asked only for D's claims to
    others), so D's cross-client count missed the victim's own rows and the server struck them from
    D's nodes' neighbourhoods unseen (26 nodes, 32 rows). The roster is now refused, naming it."""
    victim, (d, _) = withheld_claim_target(setting)
    out = withheld_claims_attack(setting, target=(victim, (d, victim)))
    detail = out.as_dict()
    assert out.detected and out.recovered == 0 and not detail["victim_accepted_roster"]
    assert f"withheld party {d}'s claims of its edges to parties [{victim}]" in detail["victim_error"]


def test_without_the_completeness_check_a_withheld_claim_goes_unseen(setting, monkeypatch):
    from fedgat.protocols import pretrain_client

    monkeypatch.setattr(pretrain_client, "check_claims_complete", lambda *a, **k: None)
    out = withheld_claims_attack(setting)
    assert out.recovered == 1 and not out.detected


@pytest.fixture(scope="module")
def apart(graph):
    """4 clients where 0 and 1 share no edge (0's edges to 1 moved to client 2), for the split roster."""
    owner = make_partition(graph, 4, beta=1.0, seed=0).owner.copy()
    src, dst = graph.edge_index.numpy()
    while np.any(hit := (owner[src] == 0) & (owner[dst] == 1)):
        owner[dst[hit]] = 2
    return AttackSetting(graph, make_partition(graph, 4, owner=owner), "vector", seed=1)


def test_a_split_roster_is_refused_at_the_check_keys(apart):
    """The server shows clients 0 and 1 rosters without each other: the clients refuse (check keys
    signed over another view of the round; a roster leaving out a client a bordering owner attends
    over), and the victim never uploads on its split view."""
    out = split_roster_attack(apart)
    d = out.as_dict()
    assert out.ran and d["hidden_pair"] == [0, 1]
    assert out.detected and out.recovered == 0 and d["refusals"] > 0


def test_without_the_key_set_binding_the_split_roster_passes(apart, monkeypatch):
    """With both defences removed (the key-set binding, and the roster check that also catches this
    split because a bordering owner attends over the hidden client) the split view goes through."""
    from fedgat.protocols import messages_pretrain, pretrain_client, pretrain_keys

    monkeypatch.setattr(pretrain_client, "check_claims_complete", lambda *a, **k: None)
    real = messages_pretrain.sealed_keys_bytes
    monkeypatch.setattr(
        pretrain_keys,
        "sealed_keys_bytes",
        lambda s, r, sealed, owners, keyset: real(s, r, sealed, owners, bytes(32)),
    )
    out = split_roster_attack(apart)
    assert out.recovered == 1 and not out.detected


def test_a_client_left_out_of_the_roster_is_refused(apart):
    """The server leaves out a client whose nodes a participant attends over: a victim bordering that
    participant refuses the roster, naming the left-out client, and never completes (it completed on
    neighbourhoods with the left-out client's rows dropped before the check)."""
    out = dropped_client_attack(apart)
    d = out.as_dict()
    assert out.ran and out.detected and out.recovered == 0 and not d["victim_completed"]
    assert f"attends over nodes of parties [{d['dropped']}], which the roster leaves out" in d["victim_error"]


def test_without_the_roster_check_the_victim_completes_without_the_left_out_rows(apart, monkeypatch):
    """Without the roster check the owner's statements still show the left-out client's rows missing
    from the bases (frame version 10); with both checks removed the victim completes without them."""
    from fedgat.protocols import pretrain_client

    monkeypatch.setattr(pretrain_client, "check_claims_complete", lambda *a, **k: None)
    out = dropped_client_attack(apart)
    d = out.as_dict()
    assert out.recovered == 0 and not d["victim_completed"]
    assert "another neighbourhood than party" in d["victim_error"]
    with statements_unchecked():
        out = dropped_client_attack(apart)
    assert out.recovered == 1 and not out.detected


@pytest.fixture(scope="module")
def training(graph):
    part = make_partition(graph, 4, beta=1.0, seed=0)
    enc = run_plaintext_pretraining(graph, part, "vector", seed=1)
    return training_attacks(TrainingSetting(graph, part, enc, seed=0), rounds=2)


def test_one_clients_update_is_never_isolated(training):
    """A cohort of one and a server that claims the others dropped after their masked inputs are
    refused by the clients; without secure aggregation the same traps read layer-1 inputs out of
    the client's update (the read-out works: secure aggregation is what stops it)."""
    out = training["chosen_weights_one_client"]
    runs = out.as_dict()["runs"]
    assert "below the minimum" in runs["cohort_of_one"]["errors"][0]
    assert any("below the threshold" in e for e in runs["lying_survivors"]["errors"])
    for name in ("cohort_of_one", "lying_survivors"):
        assert runs[name]["refused_by_clients"] and runs[name]["rounds_received"] == 0
    assert out.detected and out.recovered == 0
    ref = runs["without_secure_aggregation"]
    assert ref["secure_aggregation"] is False and ref["rounds_received"] == 2
    assert ref["layer1_inputs_recovered"] > 0


def test_aggregate_attack_runs_and_is_measured(training):
    out = training["chosen_weights_aggregate"]
    d = out.as_dict()
    assert out.ran and not out.detected and out.targets > 0
    for label, r in d["by_strategy"].items():
        assert r["rounds_aggregated"] == 2 and r["cohort_sizes"] == [4, 4], label
        assert 0.0 <= r["recovered_fraction"] <= 1.0
    # with plain SGD steps and no dropout the traps read layer-1 inputs out of the aggregate
    assert d["by_strategy"]["strategy=fedadam,feature_dropout=0.0,dropout=0.0"]["layer1_inputs_recovered"] > 0
    assert d["recovered_fraction"] == d["by_strategy"][d["headline"]]["recovered_fraction"]


def test_model_inconsistency_is_refused_and_masks_do_not_cancel(training):
    out = training["model_inconsistency"]
    d = out.as_dict()
    assert out.detected and out.recovered == 0 and d["rounds_aggregated"] == 0
    assert all("another global model" in e for e in d["errors"])
    binding = digest_binding_check()
    assert binding["same_digest_cosine_to_true_sum"] > 0.999999
    assert abs(binding["mismatched_digest_cosine_to_true_sum"]) < 0.5


def test_cohort_differencing_isolates_one_update_unless_dp_fedavg_is_on(training):
    """Known break 2 through the real protocol: K rounds of one trap state, round j without client j,
    each cohort of K - 1 = 3 accepted by the clients; the sums difference into the target's own
    update. With the dropouts off its read-out recovers layer-1 inputs, as a plaintext update's does;
    with DP-FedAvg on top the same read-out recovers none."""
    out = training["cohort_differencing"]
    d = out.as_dict()
    assert out.ran and not out.detected and d["clients"] == 4
    runs = d["runs"]
    for label, r in runs.items():
        assert r["differenced"] and r["rounds_summed"] == 4 and not r["refused_by_clients"], label
    assert runs["dropouts_off"]["layer1_inputs_recovered"] > 0
    assert runs["dropouts_off_dp_fedavg"]["layer1_inputs_recovered"] == 0
    assert runs["dropouts_off_dp_fedavg"]["recovered_foreign"] == 0
    assert d["recovered_fraction"] == runs["default"]["recovered_fraction"]


def test_unmix_splits_binary_mixtures():
    """A mean of binary rows 1_S / sqrt|S| with distinct support sizes splits back into the rows."""
    d = 200
    rng = np.random.default_rng(0)
    rows = []
    for size in (5, 9, 14):
        row = np.zeros(d)
        row[rng.choice(d, size, replace=False)] = 1 / np.sqrt(size)
        rows.append(row)
    parts = unmix(np.mean(rows, axis=0))
    best = np.array([[p @ r for p in parts] for r in rows]).max(axis=1)
    assert np.all(best > 0.999)
    assert unmix(-np.ones(d)) == []


def test_audit_server_report(graph):
    part = make_partition(graph, 3, beta=1.0, seed=0)
    lines: list[str] = []
    report = audit_server(
        graph, part, "vector", seed=1, workers=0, attacks=("server_plus_one_client",), log=lines.append
    )
    # a progress line as each step ends: the honest round, then the one attack asked for
    assert [line.split(":")[0].strip() for line in lines] == [
        "the honest encrypted round, recorded",
        "server_plus_one_client",
    ]
    assert all(re.fullmatch(r"  .+: \d+ s", line) for line in lines), lines
    assert report["shared_secret_key"] is False and report["server"]["passed"]
    assert list(report["server_attacks"]) == ["server_plus_one_client"]
    assert set(report["server_attacks_not_run"]) == set(SERVER_ATTACKS) - {"server_plus_one_client"}
    entry = report["server_attacks"]["server_plus_one_client"]
    assert entry["recovered_fraction"] == 0.0 and isinstance(entry["detected"], bool)
    with pytest.raises(ValueError, match="unknown server attacks"):
        audit_server(graph, part, attacks=("nope",))


@pytest.mark.slow
@pytest.mark.full_size
def test_cora_pretraining_attacks_are_refused_or_recover_nothing(cora):
    """Cora, 10 clients, vector variant: the pre-training attacks at full size (tens of minutes)."""
    part = make_partition(cora, 10, beta=1.0, seed=0)
    names = (
        "substituted_result",
        "injected_ciphertexts",
        "fake_edges",
        "server_plus_one_client",
    )  # colluder_forgery on Cora: benchmarks/results/audit_cora_vector_v3_forgeries.json (one more round)
    report = audit_server(cora, part, "vector", seed=0, attacks=names)
    assert report["shared_secret_key"] is False and report["server"]["passed"]
    for name in names:
        attack = report["server_attacks"][name]
        assert attack["ran"] and attack["recovered_fraction"] == 0.0, name
        assert attack["detected"] or name == "server_plus_one_client", name


def test_the_teeth_benchmark_records_the_attack_with_and_without_its_check(tmp_path):
    """``benchmarks/attack_teeth.py`` (the Cora record of row_swap): refused with the check, the
    victim completes without it, and both runs land in the JSON and Markdown it writes."""
    import json

    from fedgat.benchmarks import attack_teeth

    code = attack_teeth.main(
        ["--attack", "row_swap", "--dataset", "synthetic", "--clients", "3", "--out", str(tmp_path)]
    )
    assert code == 0
    result = json.loads((tmp_path / "audit_synthetic_vector_row_swap.json").read_text())
    assert result["with_check"]["detected"] and not result["with_check"]["victim_completed"]
    assert (
        result["without_check"]["victim_completed"]
        and result["without_check"]["victim_encoding_error"] > 1e-3
    )
    assert result["cpus"] and result["date"]
    assert (
        "| without check | False | 1 of 1 |" in (tmp_path / "audit_synthetic_vector_row_swap.md").read_text()
    )
