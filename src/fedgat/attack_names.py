"""The names of the audit's server-side attacks, in a module that imports nothing heavy: ``fedgat audit
--help`` lists them without loading torch (:mod:`fedgat.audit` runs them)."""

#: the server-side attacks :func:`fedgat.audit.audit_server` runs (pre-training, then training)
SERVER_ATTACKS = (
    "substituted_result",
    "injected_ciphertexts",
    "chosen_bases",
    "fake_edges",
    "third_party_claims",
    "relabel_forgery",
    "row_swap",
    "withheld_claims",
    "verdict_oracle",
    "split_roster",
    "dropped_client",
    "server_plus_one_client",
    "colluder_forgery",
    "chosen_weights_one_client",
    "chosen_weights_aggregate",
    "model_inconsistency",
    "cohort_differencing",
)
#: the training attacks among them (:mod:`fedgat.training_attacks`; each trains under secure
#: aggregation, so with 3 clients at least)
TRAINING_ATTACKS = (
    "chosen_weights_one_client",
    "chosen_weights_aggregate",
    "model_inconsistency",
    "cohort_differencing",
)
