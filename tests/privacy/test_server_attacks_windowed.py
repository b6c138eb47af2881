"""The hostile-server attacks of :mod:`fedgat.server_attacks` against *windowed* rounds
(``upload_window=1``: uploads granted recipient by recipient, each recipient computed on its own
through ``ServerPretrain._recipient_results``), on the small federation of ``test_server_attacks.py``:
the same outcomes as without a window, and every round checked to be windowed (its server sent
UploadGrant messages), so that no test here can pass on an un-windowed round."""

import json

import numpy as np
import pytest

from fedgat.cli import main
from fedgat.commands.audit import render_markdown, server_attacks_markdown
from fedgat.partition import make_partition
from fedgat.protocols import ClientState, Transcript
from fedgat.server_attacks import (
    FORGERIES,
    AttackSetting,
    chosen_bases_attack,
    colluder_forgery_attack,
    colluder_forgery_run,
    collusion_attack,
    fake_edges_attack,
    forged_results_attacks,
    honest_round,
    relabel_forgery_attack,
    row_swap_attack,
    shared_secret_key,
    third_party_claims_attack,
    withheld_claims_attack,
)
from fedgat.synthetic import synthetic_graph

from graph_helpers import rows_by_node

WINDOW = 1


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(num_nodes=400, num_features=16, avg_degree=4.0, seed=3)


@pytest.fixture(scope="module")
def setting(graph):
    return AttackSetting(
        graph, make_partition(graph, 3, beta=1.0, seed=0), "vector", seed=1, upload_window=WINDOW
    )


@pytest.fixture(scope="module")
def honest(setting):
    transcript = Transcript(keep_payloads=True)
    parties = honest_round(setting, transcript)
    return parties, transcript


@pytest.fixture(scope="module")
def forged(setting):
    return forged_results_attacks(setting)


def test_the_setting_refuses_a_window_that_is_not_a_positive_int(graph):
    part = make_partition(graph, 3, beta=1.0, seed=0)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="upload_window must be None or a positive int"):
            AttackSetting(graph, part, upload_window=bad)


def test_the_honest_round_is_windowed_and_shares_no_key(honest):
    parties, transcript = honest
    server = parties.server
    assert server.config.upload_window == WINDOW and server.windowed and server.done
    grants = [e for e in transcript.entries if e.sender == server.party_id and e.type_name == "UploadGrant"]
    assert grants  # the server paced the uploads
    assert all(c.config.upload_window == WINDOW and c.done for c in parties.clients.values())
    assert shared_secret_key(parties) is False and server.has_secret_key is False


@pytest.mark.parametrize("colluder", [0, 1, 2])
def test_server_plus_one_client_gets_only_the_clients_honest_view(setting, honest, colluder):
    parties, transcript = honest
    out = collusion_attack(transcript, parties, setting.truth, colluder)
    d = out.as_dict()
    assert d["upload_window"] == WINDOW and d["upload_grants"] > 0
    assert d["uploads_decrypted"] > 0 and d["results_decrypted"] > 0
    assert d["released_to_colluder"] > 0
    assert d["released_to_colluder_recovered"] == d["released_to_colluder"]  # the decryption is not blind
    assert out.targets > 0 and out.recovered == 0 and d["recovered_fraction"] == 0.0
    assert d["best_cosine_not_released"] < 0.99


@pytest.mark.parametrize("name", ["substituted_result", "injected_ciphertexts"])
def test_forged_results_are_refused_in_windowed_rounds(forged, name):
    """Every forgery kind reaches its victim through the windowed server's per-recipient compute and
    is refused there, naming node and owner; the victim aborts and never completes."""
    out = forged[name]
    d = out.as_dict()
    assert d["upload_window"] == WINDOW
    assert len(d["upload_grants"]) == len(FORGERIES) and all(n > 0 for n in d["upload_grants"])
    assert sorted(f["kind"] for f in d["forged"]) == sorted(k for k, a in FORGERIES.items() if a == name)
    assert all(f["refused"] and not f["victim_completed"] for f in d["forged"])
    assert all(len(f["owners"]) == 1 for f in d["forged"])
    assert out.ran and out.detected and out.recovered == 0 and d["recovered_fraction"] == 0.0


def test_forgeries_hit_the_same_victims_as_without_a_window(forged):
    """One victim per windowed round, the recipients in order, as the un-windowed rounds pair them."""
    victims = {f["kind"]: f["victim"] for name in forged for f in forged[name].as_dict()["forged"]}
    assert [victims[k] for k in FORGERIES] == [0, 1, 2, 0, 1]


def test_a_clients_upload_of_another_owners_node_is_refused_after_its_grant(forged):
    """The colluder waits for its grant, so the server's row check answers (not the grant check)."""
    upload = forged["injected_ciphertexts"].as_dict()["client_upload"]
    assert upload["refused_by_server"] is True
    assert upload["owner"] not in (upload["colluder"], upload["recipient"])
    assert f"party {upload['colluder']} uploads node {upload['node']}" in upload["error"]
    assert "before the server granted" not in upload["error"]


def test_server_and_one_client_cannot_forge_an_honest_owners_partial(setting):
    out = colluder_forgery_attack(setting)
    d = out.as_dict()
    assert d["upload_window"] == WINDOW and d["upload_grants"] > 0
    assert out.ran and out.targets == 1 and out.recovered == 0 and out.detected
    assert d["owner"] not in (d["colluder"], d["victim"]) and d["victim_completed"] is False


def test_the_windowed_forgery_path_is_not_blind(setting, honest):
    """The same server forging the partial of the colluder's *own* rows (which its keys do predict):
    the victim accepts it in the windowed round, completes, and its encoding of the node is the
    honest one plus delta, so the tampering does run on the windowed compute path."""
    parties, driver, server = colluder_forgery_run(setting, own=True)
    assert parties.server.config.upload_window == WINDOW and driver.upload_grants > 0
    assert server.victim is not None and server.target is not None and server.delta is not None
    victim = parties.clients[server.victim]
    assert [exc for pid, exc in driver.rejected if pid == server.victim] == []
    assert victim.state is ClientState.DONE
    got, want = (rows_by_node(p.clients[server.victim].encodings) for p in (parties, honest[0]))
    node = server.target[0]
    diff = got[node] - want[node]
    np.testing.assert_allclose(diff[0], server.delta, rtol=0, atol=1e-6)
    assert np.abs(diff[1:]).max() <= 1e-6
    assert max(np.abs(got[n] - want[n]).max() for n in got if n != node) <= 1e-6


def test_fake_edges_are_refused_and_release_nothing(setting):
    out = fake_edges_attack(setting, fakes=6)
    d = out.as_dict()
    assert d["upload_window"] == WINDOW
    honest, blind = d["runs"]["honest_server"], d["runs"]["claim_blind_server"]
    assert honest["server_refused"] and "does not confirm" in honest["server_error"]
    assert honest["rows_released_to_colluder"] == 0
    assert blind["upload_grants"] > 0  # the check-skipping server's round is windowed
    assert blind["rows_released_for_fake_targets"] == 0 and blind["rows_released_beyond_honest_view"] == 0
    assert blind["rows_released_to_colluder_recovered"] == blind["rows_released_to_colluder"] > 0
    assert out.targets == 6 and out.recovered == 0 and out.detected


def test_a_relabelled_foreign_neighbour_is_refused(setting):
    out = relabel_forgery_attack(setting)
    assert out.as_dict()["upload_window"] == WINDOW
    assert out.detected and out.recovered == 0 and not out.as_dict()["victim_completed"]


def test_an_owners_rows_swapped_in_a_foreign_neighbourhood_are_refused(setting):
    out = row_swap_attack(setting)
    assert out.as_dict()["upload_window"] == WINDOW
    assert out.detected and out.recovered == 0 and not out.as_dict()["victim_completed"]


def test_bases_off_the_identity_are_refused(setting):
    out = chosen_bases_attack(setting, "merge")
    assert out.as_dict()["upload_window"] == WINDOW
    assert out.detected and out.recovered == 0


def test_a_withheld_claim_is_refused(setting):
    out = withheld_claims_attack(setting)
    assert out.as_dict()["upload_window"] == WINDOW
    assert out.detected and out.recovered == 0 and not out.as_dict()["victim_completed"]


def test_third_party_claims_release_nothing(setting):
    out = third_party_claims_attack(setting)
    d = out.as_dict()
    assert d["upload_window"] == WINDOW
    honest, blind = d["runs"]["honest_server"], d["runs"]["claim_blind_server"]
    assert honest["server_refused"] and honest["rows_released_to_colluder"] == 0
    assert blind["upload_grants"] > 0 and blind["rows_released_beyond_honest_view"] == 0
    assert blind["rows_released_to_colluder_recovered"] == blind["rows_released_to_colluder"] > 0
    assert out.recovered == 0 and out.detected


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_audit_refuses_a_window_that_is_not_a_positive_int(capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--upload-window", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --upload-window: must be a positive integer, got '{bad}'" in err and err.count("\n") == 1
    )


def test_audit_markdown_names_the_upload_window():
    base = {
        "dataset": "synthetic",
        "variant": "vector",
        "clients": 3,
        "beta": 1.0,
        "mitigation": {},
        "attacked_clients": 0,
        "chance_reidentification": 0.0,
        "client_attacks": {},
    }
    for window, text in ((None, "none (every upload before compute)"), (2, "2 recipient(s) at a time")):
        assert f"Upload window of the encrypted rounds: {text}" in render_markdown(
            {**base, "upload_window": window}
        )
    assert "none (every upload before compute)" in render_markdown(base)  # a report from before the flag
    assert "Upload window" not in render_markdown({**base, "server_side": False})  # --no-server-check


def test_audit_markdown_says_what_each_attack_tries_and_which_breaks_stay_open():
    """Each server attack that ran is tabled with its status (SECURITY.md's open breaks named) and listed
    with a sentence on what it tries and its short facts, not a raw JSON blob; attacks left out by
    ``--server-attacks`` are not called 'nothing to target'."""
    row = {"targets": 8, "recovered": 0, "recovered_fraction": 0.0, "detected": True, "ran": True}
    report = {
        "server_attacks": {
            "verdict_oracle": {**row, "note": "every probe refused", "probes": 8, "per_probe": [[1, 2]] * 50},
            "fake_edges": {**row, "note": ""},
            "chosen_weights_aggregate": {
                **row,
                "recovered": 1,
                "detected": False,
                "note": "",
                "rounds": 3,
                "by_strategy": {},
            },
            "row_swap": {**row, "recovered": 2, "note": ""},
        },
        "server_attacks_not_run": ["substituted_result", "split_roster"],
        "server_attacks_chosen": [
            "verdict_oracle",
            "fake_edges",
            "split_roster",
            "row_swap",
            "chosen_weights_aggregate",
        ],
    }
    text = "\n".join(server_attacks_markdown(report))
    assert "| verdict_oracle | 8 | 0 | 0.0000 | True | open, bounded by DP (break 22) |" in text
    assert "| fake_edges | 8 | 0 | 0.0000 | True | closed |" in text
    assert "- **verdict_oracle**: the server tampers with one slot" in text and "every probe refused" in text
    assert "(probes 8; the rest in the JSON)" in text and "per_probe" not in text
    assert "- **fake_edges**: the server (with a colluding client) claims edges" in text
    assert (
        "| chosen_weights_aggregate | 8 | 1 | 0.0000 | False | allowed by secure aggregation, measured"
        in text
    )
    assert "| row_swap | 8 | 2 | 0.0000 | True | **recovered 2**: see SECURITY.md |" in text  # never "closed"
    assert "Not run (nothing to target in this setting): split_roster" in text
    assert "Not asked for (`--server-attacks`): substituted_result" in text
    # nothing ran (e.g. 2 clients and only training attacks asked for): the reasons are still printed
    idle = {"server_attacks": {}, "server_attacks_not_run": ["cohort_differencing"]}
    text = "\n".join(server_attacks_markdown(idle))
    assert "No server-side attack ran" in text and "| attack |" not in text
    assert "Not run (nothing to target in this setting): cohort_differencing" in text


def test_audit_markdown_tables_only_the_training_attacks_that_ran():
    """An attack with nothing to target (here 3 clients: no cohort to difference) is listed under "Not
    run", not tabled with zeros as well (a newcomer's review)."""
    row = {"targets": 0, "recovered": 0, "recovered_fraction": 0.0, "detected": False, "note": "n/a"}
    runs = {
        "plain": {
            "differenced": 0,
            "recovered_foreign": 0,
            "recovered_fraction": 0.0,
            "layer1_inputs_recovered": 0,
            "best_foreign_cosine": 0.0,
        }
    }
    diff = {**row, "target": 0, "clients": 3, "runs": runs}
    for ran in (False, True):
        report = {
            "server_attacks": {"cohort_differencing": {**diff, "ran": ran}},
            "server_attacks_not_run": [] if ran else ["cohort_differencing"],
        }
        text = "\n".join(server_attacks_markdown(report))
        assert ("Cohort differencing (target" in text) is ran
        assert ("Not run (nothing to target in this setting): cohort_differencing" in text) is not ran


@pytest.mark.slow  # ~20 s: the command end to end (the default suite's budget is ~15 min on 2 cores)
def test_audit_command_records_the_window(tmp_path, capsys):
    """``fedgat audit --upload-window 1`` (through :func:`fedgat.audit.audit_server`): the server
    side's round is windowed, the JSON and the Markdown say so."""
    out = tmp_path / "a.json"
    argv = ["audit", "--dataset", "synthetic", "--clients", "3", "--upload-window", "1", "--no-training"]
    argv += ["--server-attacks", "server_plus_one_client", "--attack-clients", "1", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (
        report["upload_window"] == 1 and report["server"]["passed"] and report["shared_secret_key"] is False
    )
    entry = report["server_attacks"]["server_plus_one_client"]
    assert entry["upload_window"] == 1 and entry["upload_grants"] > 0
    assert entry["ran"] and entry["recovered_fraction"] == 0.0
    assert "Upload window of the encrypted rounds: 1 recipient(s) at a time" in capsys.readouterr().out


def test_audit_markdown_reads_a_dp_release_against_its_null_release():
    """With ``--dp-epsilon`` the clients' table sets each attack's re-identification beside the same
    attack on a null release (the chance level of the scoring, not the blind guess), and the accuracy
    names its test-set size."""
    score = {"victims": 10, "recovered_fraction": 0.0, "mean_cosine": 0.1, "reidentification_rate": 0.2}
    report = {
        "dataset": "synthetic",
        "variant": "vector",
        "clients": 3,
        "beta": 1.0,
        "mitigation": {},
        "attacked_clients": 3,
        "chance_reidentification": 0.01,
        "client_attacks": {"basis": score, "prior_knowledge": score},
        "null_release_attacks": {"basis": {**score, "reidentification_rate": 0.15}},
        "test_accuracy": 0.8,
        "distgat_test_accuracy": 0.5,
        "test_nodes": 24,
    }
    text = render_markdown(report)
    assert "| re-identified | re-identified, null release |" in text
    assert "| basis | 10 | 0.000 | 0.100 | 0.200 | 0.150 |" in text
    assert "| prior_knowledge | 10 | 0.000 | 0.100 | 0.200 | - |" in text
    assert "(DistGAT, no sharing: 0.500); 24 test nodes." in text
    del report["null_release_attacks"]
    assert "null release" not in render_markdown(report)
