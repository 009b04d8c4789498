"""The region tuner's loop: a resumed compile's search finds again what the interrupted one measured."""
from kiln.search.budget import Deadline
from kiln.search.saturate import Limits, saturate
from kiln.search.tuner import Outcome, RegionTuner
from kiln.search.tunedb import TuneDB
from kiln.tests.test_saturate import long_sum, with_associativity


def test_a_resumed_search_with_no_time_left_still_weighs_every_candidate_measured_before(tmp_path):
    """A compile interrupted after measuring some candidates, resumed with a region's budget spent:
    the tuner replays the same draws from the database (none evaluated again) and so chooses among
    all of them, not the program as lowered alone (how a 1.16x prefill layer was lost on the H200)."""
    program = [long_sum(6)]
    saturated = saturate(program, with_associativity(), Limits(max_enodes=4_000))
    evaluated: list[str] = []

    def evaluate(outputs, variant):
        evaluated.append(variant)
        # a cost that differs between bracketings: the deeper a sum nests, the dearer
        def depth(node):
            return 1 + max((depth(k) for k in node.inputs), default=0)
        return Outcome("ok", 1e-6 * sum(depth(o) for o in outputs) + (1e-7 if variant == "b" else 0.0))

    def tuner(db):
        return RegionTuner("r", "layer", program, saturated, ["a", "b"], evaluate,
                           end_to_end=lambda outputs, variant: evaluate(outputs, variant).estimate_s,
                           db=db, compile_id="c1", seed=3)

    with TuneDB(tmp_path / "tune.sqlite") as db:
        first = tuner(db)
        first.measure_lowered(Deadline(60))
        interrupted = first.run(Deadline(60), max_candidates=12)
    assert first.progress.tried == first.progress.measured == 12 and interrupted.key != "original/a"
    measured = len(evaluated)
    with TuneDB(tmp_path / "tune.sqlite") as db:
        resumed = tuner(db)
        resumed.measure_lowered(Deadline(0))
        winner = resumed.run(Deadline(0), max_candidates=12)
    assert len(evaluated) == measured                        # nothing evaluated again
    assert resumed.progress.tried == first.progress.tried
    assert resumed.progress.measured == 0      # its candidates a minute count none of them
    assert (winner.key, winner.end_to_end_s) == (interrupted.key, interrupted.end_to_end_s)
