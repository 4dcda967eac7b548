"""podsrl.stats on hand-made curves with answers worked by hand, and a null simulation: the same
true curve plus noise for two methods gives intervals that cover 1 (a ratio) or 0 (a difference)
about 95% of the time."""

import math

import numpy as np
import pytest

from podsrl import stats


def curves(*seeds, seconds_per_step=10.0) -> list:
    """A method's seeds, each ``[(step, accuracy), ...]``, on a clock of ``seconds_per_step``."""
    out = []
    for points in seeds:
        steps = [s for s, _ in points]
        clock = np.arange(0, steps[-1] + 1, dtype=float)
        out.append(stats.Curve(np.array(steps, float), np.array([a for _, a in points]), clock, clock * seconds_per_step))
    return out


def runs(*seeds, seconds_per_step=10.0):
    """:func:`curves` on common step grids."""
    return stats.align(curves(*seeds, seconds_per_step=seconds_per_step))


def test_reach_is_linear_between_evaluations():
    x = np.array([0.0, 10.0, 20.0])
    y = np.array([[0.1, 0.3, 0.5],   # 0.4: halfway from 0.3 at 10 to 0.5 at 20 -> 15
                  [0.1, 0.3, 0.5],   # 0.3: at the evaluation itself -> 10
                  [0.5, 0.6, 0.7],   # 0.4: already at the first point -> 0
                  [0.1, 0.2, 0.3]])  # 0.4: never
    assert stats.reach(x, y, np.array([0.4, 0.3, 0.4, 0.4])) == pytest.approx([15, 10, 0, math.nan], nan_ok=True)


def test_area_mean_up_to_an_end_between_points():
    # 0.0 -> 1.0 over 0-10, then 1.0 to 20. Up to 20: (5 + 10) / 20. Up to 15: (5 + 5) / 15.
    # Up to 5, where the curve is 0.5: 0.25 * 5 / 5.
    y = np.tile([0.0, 1.0, 1.0], (3, 1))
    assert stats.area_mean(np.array([0.0, 10.0, 20.0]), y, np.array([20.0, 15.0, 5.0])) == pytest.approx([0.75, 10 / 15, 0.25])


def test_ratio_of_steps_with_never():
    # never (NaN) over reached is ∞; reached over never 0; never over never undefined; 0 over 0 is 1
    r = stats.ratio(np.array([5.0, math.nan, 5.0, math.nan, 0.0, 3.0]), np.array([10.0, 10.0, math.nan, math.nan, 0.0, 0.0]))
    assert r == pytest.approx([0.5, math.inf, 0.0, math.nan, 1.0, math.inf], nan_ok=True)


def test_align_reads_each_seed_at_every_evaluation_step_without_carrying_it_forward():
    # seed 0 evaluated at steps 0, 10, 20; seed 1 at 0, 5, 15 (its last): the grid is 0, 5, 10, 15.
    # Seed 0 at 5: halfway from 0.0 to 0.2 (0.1); at 15: halfway from 0.2 to 0.4 (0.3), not 0.2 held.
    # Seed 1 at 10: halfway from 0.5 (step 5) to 0.7 (step 15): 0.6.
    r = runs([(0, 0.0), (10, 0.2), (20, 0.4)], [(0, 0.0), (5, 0.5), (15, 0.7)])
    assert list(r.steps) == [0, 5, 10, 15]
    assert r.accuracy == pytest.approx(np.array([[0.0, 0.1, 0.2, 0.3], [0.0, 0.5, 0.6, 0.7]]))
    assert r.eval_seconds[0] == pytest.approx([0, 50, 100, 150])


def test_time_is_each_seeds_own_clock_at_the_step():
    # one seed of each method; the reference takes 1 s a step up to step 10, then 3 s a step
    # (10 s at step 10, 40 s at step 20). Its target, 90% of the gain 0.0 -> 0.5 (the mean of its
    # last three evaluations, 0.4, 0.5, 0.6): 0.45, reached at step 10 + 10 * 0.05 / 0.1 = 15,
    # where its clock reads 10 + 5 * 3 = 25 s (not 15 * 2 = 30 s, a straight line from 0 to 40 s).
    ref = stats.align([stats.Curve(np.array([0.0, 5, 10, 20]), np.array([0.0, 0.3, 0.5, 0.6]),
                                   np.array([0.0, 10, 20]), np.array([0.0, 10, 40]))])
    assert stats.final_level(ref.accuracy) == pytest.approx([(0.3 + 0.5 + 0.6) / 3])
    m = stats.measures(ref, ref, np.ones((1, 1)))
    # final (0.3 + 0.5 + 0.6) / 3 = 0.4667: target 0.9 * 0.4667 = 0.42, at 5 + 5 * 0.12 / 0.2 = 8 steps, 8 s
    assert m["target_gain"] == pytest.approx([0.42]) and m["steps_to_gain"] == pytest.approx([8.0])
    assert m["time_to_gain"] == pytest.approx([8.0])
    # the peak 0.6 at step 20, 40 s; the mean accuracy over steps 0-20:
    # (0.15 * 5 + 0.4 * 5 + 0.55 * 10) / 20 = 0.4125; over its 40 s: (0.15 * 5 + 0.4 * 5 + 0.55 * 30) / 40
    assert m["steps_to_peak"] == pytest.approx([20]) and m["time_to_peak"] == pytest.approx([40])
    assert m["mean_accuracy_steps"] == pytest.approx([0.4125]) and m["mean_accuracy_time"] == pytest.approx([19.25 / 40])


def test_paired_bootstrap_on_two_seeds_by_hand():
    # reference: both seeds 0.0, 0.2, 0.4, 0.4, 0.4 at steps 0-40 (target 0.9 * 0.4 = 0.36 at
    # step 10 + 10 * 0.16 / 0.2 = 18). Method, seed 0: 0.0, 0.4, ... reaches 0.36 at step 9 (ratio
    # 0.5); seed 1: 0.0, 0.1, 0.2, 0.3, 0.3 never. A resample draws seed 0 twice (1 in 4): ratio 0.5;
    # otherwise its mean reaches at most 0.35 (both seeds, from step 30 on) or 0.3: never, ∞.
    ref_seeds = [[(0, 0.0), (10, 0.2), (20, 0.4), (30, 0.4), (40, 0.4)]] * 2
    method_seeds = [(0, 0.0), (10, 0.4), (20, 0.4), (30, 0.4), (40, 0.4)], [(0, 0.0), (10, 0.1), (20, 0.2), (30, 0.3), (40, 0.3)]
    ref, method = runs(*ref_seeds), runs(*method_seeds)
    est = stats.compare_runs(ref, method)
    per_seed = stats.each_seed(curves(*ref_seeds), curves(*method_seeds))
    assert per_seed["step_ratio_to_gain"] == pytest.approx([0.5, math.inf])
    # the seed mean 0.0, 0.25, 0.3, 0.35, 0.35 never reaches 0.36
    assert math.isnan(est["steps_to_gain"].value) and est["step_ratio_to_gain"].value == math.inf
    never = est["step_ratio_to_gain"].never
    assert 1400 < never < 1600  # 3 in 4 of the 2000 resamples
    assert est["step_ratio_to_gain"].low == 0.5 and est["step_ratio_to_gain"].high == math.inf
    assert est["speedup_to_gain"].low == 0.0 and est["speedup_to_gain"].high == pytest.approx(2.0)
    assert est["step_ratio_to_gain"].resamples == 2000
    # the draws: each resample counts the seeds it drew, never the reference's own seeds apart
    w = stats.bootstrap_weights(2, 2000)
    assert w.sum(1) == pytest.approx(np.ones(2000)) and set(np.unique(w)) <= {0.0, 0.5, 1.0}
    assert never == int((w[:, 0] < 1).sum())


def test_each_seed_is_read_on_its_own_whole_curves_not_cut_to_the_shortest_seed():
    # seed 1 stopped at step 10; seed 0 reaches the reference's peak 0.6 at step 30 and its gain
    # target (0.9 of 0.0 -> 0.6, its last three 0.6) 0.54 at 20 + 10 * 0.14 / 0.2 = 27
    ref_seeds = [[(0, 0.0), (10, 0.2), (20, 0.4), (30, 0.6), (40, 0.6), (50, 0.6)]] * 2
    method_seeds = [(0, 0.0), (10, 0.2), (20, 0.4), (30, 0.6)], [(0, 0.0), (10, 0.1)]
    per_seed = stats.each_seed(curves(*ref_seeds), curves(*method_seeds))
    assert per_seed["steps_to_peak"][0] == pytest.approx(30) and per_seed["target_peak"] == pytest.approx([0.6, 0.6])
    assert per_seed["steps_to_gain"][0] == pytest.approx(27) and math.isnan(per_seed["steps_to_gain"][1])
    assert per_seed["final_level"][0] == pytest.approx((0.2 + 0.4 + 0.6) / 3)


def test_a_reference_that_gains_nothing_gives_no_ratio():
    flat = [[(0, 0.3), (10, 0.2), (20, 0.3), (30, 0.25)]] * 2
    est = stats.compare_runs(runs(*flat), runs([(0, 0.3), (10, 0.5), (20, 0.5), (30, 0.5)], [(0, 0.3), (10, 0.4),
                                                                                          (20, 0.4), (30, 0.4)]))
    for name in ("step_ratio_to_gain", "speedup_to_gain", "step_ratio_to_peak", "speedup_to_peak"):
        assert math.isnan(est[name].value) and est[name].low is None, name


def test_percentile_interval_is_exact():
    # 2000 values 1..2000: the 2.5% point is the 50th smallest, the 97.5% point the 1950th
    values = np.random.default_rng(0).permutation(np.arange(1.0, 2001.0))
    assert stats.interval(values) == (50.0, 1950.0)
    # NaN (undefined) left out: of 1, 2, ∞ the 25% point is the first (0.75 of three values), the
    # 75% point the third (2.25 of three)
    assert stats.interval(np.array([math.nan, 1.0, math.inf, 2.0]), 0.5) == (1.0, math.inf)
    assert stats.sample_sd([1.0, 3.0, None]) == pytest.approx(2 ** 0.5) and stats.sample_sd([1.0]) is None



# reference: three seeds 0.0, 0.2, 0.4, 0.4, 0.4 at steps 0-40 (90% of the gain to the mean of the last
# three, 0.36, at step 10 + 10 * 0.16 / 0.2 = 18). Method: two seeds reach 0.36 at step 9 (0.4 at step
# 10), one at 30 + 10 * 0.06 / 0.1 = 36, rising 0.1 a step of 10: per-seed ratios 0.5, 0.5, 2.
REFERENCE = [[(0, 0.0), (10, 0.2), (20, 0.4), (30, 0.4), (40, 0.4)]] * 3
FAST, SLOW = [(0, 0.0), (10, 0.4), (20, 0.4), (30, 0.4), (40, 0.4)], [(0, 0.0), (10, 0.1), (20, 0.2), (30, 0.3), (40, 0.4)]


def test_geometric_mean_of_ratios_under_weights_by_hand():
    halves = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])  # seed 0 twice, each once, seed 1 twice
    assert stats.geometric_mean(np.array([0.5, 2.0]), halves) == pytest.approx([0.5, 1.0, 2.0])  # sqrt(0.5 * 2) = 1
    # never: a draw holding ∞ is ∞; holding 0 and ∞ undefined; a seed neither reaches is left out
    assert stats.geometric_mean(np.array([0.5, math.inf]), halves) == pytest.approx([0.5, math.inf, math.inf])
    assert stats.geometric_mean(np.array([0.0, math.inf]), halves) == pytest.approx([0.0, math.nan, math.inf], nan_ok=True)
    assert stats.geometric_mean(np.array([math.nan, 2.0]), halves) == pytest.approx([math.nan, 2.0, 2.0], nan_ok=True)
    assert stats.geometric_mean(np.array([1.0, 8.0, 1.0]), np.full((1, 3), 1 / 3)) == pytest.approx([2.0])  # cube root of 8


def test_per_seed_step_ratio_is_the_geometric_mean_of_each_seed_against_its_own_reference():
    ratios, est = stats.per_seed_step_ratio(runs(*REFERENCE), runs(FAST, FAST, SLOW))
    assert ratios == pytest.approx([0.5, 0.5, 2.0])
    assert est.value == pytest.approx(0.5 ** (1 / 3))  # (0.5 * 0.5 * 2) ** (1/3) = 0.794; the arithmetic mean is 1
    # a resample's mean is (0.5^a 2^b)^(1/3) with b the draws of the slow seed: 0.5, 2^(-1/3), 2^(1/3), 2.
    # P(b = 0) = 8/27 and P(b = 3) = 1/27 both exceed 2.5%: the interval runs from 0.5 to 2
    assert est.low == pytest.approx(0.5) and est.high == pytest.approx(2.0) and est.never == 0 and est.resamples == 2000
    # the seed-mean curve 0.0, 0.3, 0.333, 0.367, 0.4 reaches 0.36 at step 20 + 10 * 0.0267 / 0.0333 = 28: 28 / 18
    seed_mean = stats.compare_runs(runs(*REFERENCE), runs(FAST, FAST, SLOW))
    assert seed_mean["step_ratio_to_gain"].value == pytest.approx(28 / 18)
    # a seed that never reaches its target: the point is ∞, and so is every resample that drew it (19/27)
    flat = [(0, 0.0), (10, 0.1), (20, 0.1), (30, 0.1), (40, 0.1)]
    ratios, est = stats.per_seed_step_ratio(runs(*REFERENCE), runs(FAST, FAST, flat))
    assert ratios == pytest.approx([0.5, 0.5, math.inf]) and est.value == math.inf
    assert est.low == pytest.approx(0.5) and est.high == math.inf and 1300 < est.never < 1520  # 2000 * 19/27 = 1407
    _, one = stats.per_seed_step_ratio(runs(REFERENCE[0]), runs(SLOW))
    assert one.value == pytest.approx(2.0) and one.low is None


def test_sensitivity_of_the_step_ratio_to_q_and_the_final_window_by_hand():
    reference, method = runs(*REFERENCE), runs(FAST, FAST, SLOW)
    cells = stats.sensitivity(reference, method)
    assert set(cells) == {(q, w) for q in (0.8, 0.9, 0.95) for w in (3, 5)}
    # window 3: the reference's final level 0.4. q = 0.8: 0.32 at 10 + 10 * 0.12 / 0.2 = 16; the
    # method's seed-mean curve (0.0, 0.3, 0.333, 0.367, 0.4) at 10 + 10 * 0.02 / 0.0333 = 16: 1.
    # q = 0.95: 0.38 at 19 against 30 + 10 * 0.0133 / 0.0333 = 34
    assert cells[0.8, 3].value == pytest.approx(1.0)
    assert cells[0.9, 3].value == pytest.approx(28 / 18)
    assert cells[0.95, 3].value == pytest.approx(34 / 19)
    # window 5 (all five evaluations): final level 0.28. q = 0.9: 0.252 at 10 + 10 * 0.052 / 0.2 =
    # 12.6 against 10 * 0.252 / 0.3 = 8.4; q = 0.8 and 0.95 give 2/3 as well (both reached before step 10)
    for q in (0.8, 0.9, 0.95):
        assert cells[q, 5].value == pytest.approx(2 / 3)
    # the comparison's own q and window is its figure: the same point, interval and resamples
    est = stats.compare_runs(reference, method)
    assert cells[0.9, 3] == est["step_ratio_to_gain"]
    assert stats.sensitivity(runs(REFERENCE[0]), runs(SLOW))[0.9, 3].low is None

def simulate(rng, seeds=8, slower=1.0):
    """Two methods on one true learning curve (``slower`` stretches the second's steps): each
    seed shares its step-0 evaluation, each run has a level of its own that grows with training
    (sd 0.03 at the end) and each evaluation noise of its own (sd 0.02, about that of 500
    problems), 13 evaluations over 60 steps, 7 s a step give or take 5% a run."""
    steps = np.arange(0, 61, 5.0)
    base = 0.05 + rng.normal(0, 0.01, seeds)

    def method(stretch):
        true = 0.05 + 0.32 * (1 - np.exp(-steps / (20 * stretch)))
        acc = true + rng.normal(0, 0.03, (seeds, 1)) * steps / 60 + rng.normal(0, 0.02, (seeds, len(steps)))
        acc[:, 0] = base
        clock = np.arange(61.0) * 7.0 * rng.normal(1, 0.05, (seeds, 1))
        return stats.Runs(steps, acc, clock[:, ::5], np.arange(61.0), clock)

    return method(1.0), method(slower)


ROBUST = ("step_ratio_to_gain", "speedup_to_gain", "mean_accuracy_steps_diff", "mean_accuracy_time_diff", "final_level_diff")


def coverage(slower=1.0, replicates=200, resamples=500):
    """Over ``replicates`` simulated comparisons: the share of intervals covering 1 (a ratio) or
    0 (a difference), per figure; and the share in which the seed-mean curve never reaches the
    target and the median point estimate of the step ratios, per target."""
    rng = np.random.default_rng(1)
    covered = {name: 0 for name in (*ROBUST, "step_ratio_to_peak", "speedup_to_peak")}
    points = {"gain": [], "peak": []}
    for _ in range(replicates):
        reference, method = simulate(rng, slower=slower)
        est = stats.compare_runs(reference, method, resamples=resamples)
        for name in covered:
            covered[name] += est[name].low <= (0.0 if name.endswith("_diff") else 1.0) <= est[name].high
        for target in points:
            points[target].append(est[f"step_ratio_to_{target}"].value)
    never = {t: float(np.mean(np.isinf(v))) for t, v in points.items()}
    return {k: v / replicates for k, v in covered.items()}, never, {t: float(np.median(v)) for t, v in points.items()}


def test_null_simulation_intervals_cover_the_truth_about_95_percent_of_the_time():
    covered, never, median = coverage()
    # measured with these seeds: step ratio 0.94, speed-up 0.905, mean accuracy over steps 0.90,
    # over time 0.88, final level 0.885 (8 seeds: a percentile bootstrap over few seeds runs a
    # little short of 95%)
    for name in ROBUST:
        assert 0.85 <= covered[name] <= 0.99, (name, covered[name])
    # the gain target is nearly always reached (measured: in 199 of 200 replicates) and its ratio
    # is centred on 1; the paper's peak target, the maximum of a noisy curve, is never reached by
    # the other method's seed-mean curve in about half the replicates (measured: 0.51), so its
    # point estimate says little
    assert never["gain"] <= 0.02 and abs(median["gain"] - 1) < 0.05
    assert never["peak"] > 0.35


def test_a_real_difference_is_not_covered():
    """The same simulation with the second method learning 1.5x slower per step: its intervals
    leave out 1 and 0 (the coverage test above could fail)."""
    covered, never, median = coverage(slower=1.5, replicates=100)
    assert covered["step_ratio_to_gain"] < 0.2 and covered["mean_accuracy_steps_diff"] < 0.2
    assert median["gain"] > 1.2
    # the paper's statistic tells the difference far less often (measured: its interval covers 1
    # in 34 of 100 replicates, the gain's in 9), and the slower method's seed-mean curve never
    # reaches the peak in 93 of 100
    assert covered["step_ratio_to_peak"] > covered["step_ratio_to_gain"] + 0.15 and never["peak"] > 0.8
