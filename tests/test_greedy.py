"""The rule the engine tests and experiment 13 judge outputs by."""

from saria.bench.greedy import TIE, Greedy, first_difference, gap, same_greedy


def test_identical_outputs_agree():
    assert same_greedy(Greedy([4, 5, 6], [1.0, 2.0, 3.0]), Greedy([4, 5, 6], [0.5, 0.5, 0.5]))


def test_outputs_that_part_at_a_near_tie_of_either_run_agree():
    want = Greedy([4, 5, 6], [1.0, TIE / 2, 1.0])
    got = Greedy([4, 9, 9], [1.0, 1.0, 1.0])
    assert first_difference(got, want) == 1
    assert same_greedy(got, want) and same_greedy(want, got)


def test_outputs_that_part_at_a_clear_winner_do_not():
    want = Greedy([4, 5, 6], [1.0, TIE / 2, 1.0])
    got = Greedy([4, 5, 7], [1.0, TIE / 2, TIE * 2])
    assert first_difference(got, want) == 2
    assert not same_greedy(got, want)


def test_outputs_of_other_lengths_never_agree():
    got, want = Greedy([4, 5], [TIE / 2] * 2), Greedy([4, 5, 6], [TIE / 2] * 3)
    assert first_difference(got, want) == 2
    assert not same_greedy(got, want)


def test_a_steps_gap_is_the_lead_of_its_best_token():
    assert gap([-0.5, -2.0, -0.25]) == 0.25
    assert gap([-1.0]) == float("inf")
