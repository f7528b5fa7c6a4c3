# The autoencoder trained on several processes under Cadence's policies finishes and is scored;
# skipped (saying why) where cadence.torch or the bindings are not installed.
import pytest

from cadence.lstm_node2vec import Config, evolving_sbm
from cadence.lstm_node2vec import distributed

why = distributed.available()
pytestmark = pytest.mark.skipif(bool(why), reason=why or "")


def test_a_distributed_run_finishes_under_every_policy_and_scores_its_checkpoints():
    # one set of 3 processes (a server and 2 workers) runs every policy of the comparison in turn
    from cadence.lstm_node2vec.experiment import Tasks
    s = evolving_sbm(n=100, communities=3, snapshots=4, seed=0)
    cfg = Config(dim=8, token_dim=4, lookback=3, temporal_walks=3, ae_epochs=2, ae_batch=64)
    policies = ["bsp", "ssp:1", "dssp:1:3", "elastic:3", "elastic-avg:3"]
    rows = distributed.run_all(s, cfg, Tasks(s, 2, cfg), 2, policies, workers=2, profile="hetero2",
                               target_auc=0.0, eval_walks=200)
    assert [r["policy"] for r in rows] == policies
    for r in rows:
        assert r["seconds"] > 0
        # Measured band, not [0, 1]: 11 runs of this configuration (2026-12-04) scored a final
        # link AUC of 0.456 to 0.486 under every policy (0.456 to 0.496 along the curves). At this
        # size the autoencoder does not beat chance on links (its AUC falls as it trains), so the
        # band is a regression check on the training and scoring path: NaN, a degenerate 0 or 1,
        # or a shift of more than about 0.035 from what it measures lands outside it.
        assert 0.42 <= r["final_link_auc"] <= 0.53, (r["policy"], r["final_link_auc"])
        assert r["curve"][-1][1] == r["final_link_auc"]
        assert r["seconds_to_target"] is not None
        # the loss is scored at every checkpoint; the target is 90% of the single-process loss reduction
        assert len(r["loss_curve"]) == len(r["curve"]) and r["final_loss"] == r["loss_curve"][-1][1]
        assert r["single_process_loss"] < r["target_loss"] < r["initial_loss"]
        assert r["final_loss"] < r["initial_loss"], (r["policy"], r["initial_loss"], r["final_loss"])  # it trained
        hit = [t for t, x in r["loss_curve"] if x <= r["target_loss"]]
        assert r["seconds_to_target_loss"] == (hit[0] if hit else None)
        if r["policy"].startswith("elastic-avg"):
            assert r["barriers"] >= 1 and sum(r["steps"]) >= r["step_budget"]
        else:
            # the workers share the budget exactly; every step is one push
            assert r["pushes"] == r["steps"] and sum(r["steps"]) == r["step_budget"]
    # bsp never lets a worker start ahead of the slowest
    assert rows[0]["max_staleness"] == [0, 0]
