"""Statistics of a comparison over seeds: pure functions over per-seed curves (numpy), used by
``podsrl compare``'s summary, its plots and ``benchmarks/evidence.py``.

A run gives a :class:`Curve`: its held-out accuracy at its evaluations and its training clock
(seconds at each optimizer step). The definitions:

- **Seed-mean curve, aligned by optimizer step.** Each seed's accuracy, drawn linearly between
  its evaluations, is read at every evaluation step of any seed up to the shortest seed's last
  evaluation, and averaged over seeds at each step. (A comparison on a step budget evaluates
  every seed at the same steps: there nothing is interpolated.)
- **Time at a step**: each seed's own training seconds at that step, linear between its step
  records, averaged over seeds. The curve against time is (mean seconds, mean accuracy) at each
  step of the seed-mean curve; nothing is carried forward from one seed's evaluation to another's.
- **Reach**: the first step at which a curve, drawn linearly between its evaluations, is at or
  above a target (on the seed-mean curve for the headline figures, on a seed's own curve for the
  per-seed ones); its time is the time at that step. A curve that never gets there is "never".
- **Per-seed figures**: each seed against its own reference run, on the two runs' whole curves
  (not cut at the shortest seed's last evaluation, as the seed means are).
- **The gain target**: ``base + q (final - base)``, with ``base`` the reference's seed-mean
  accuracy at its first evaluation (step 0, the same model and problems for every method of a
  seed) and ``final`` the mean of its seed-mean curve's last ``window`` evaluations, not its
  maximum. **The paper's target**: the maximum of the reference's seed-mean curve. A target no
  higher than ``base`` (a reference that gains nothing) times nothing: its ratios and speed-ups
  are undefined (NaN, "n/a"), not 0 over 0.
- **Mean accuracy over the budget**: the area under the seed-mean curve over steps ``[0, end]``
  divided by ``end``, where ``end`` is the shorter of the two methods' last steps; against time,
  the same up to the shorter method's time budget (its seed-mean seconds at its last evaluation).
- **Final level**: the mean of a seed-mean curve's last ``window`` evaluations.
- **Paired bootstrap over seeds**: a resample draws S seeds with replacement, the same seeds for
  the reference and every method (a seed is one prompt order and one step-0 evaluation). It is a
  weight matrix ``W [R, S]`` (draw counts / S), so a resample's seed-mean curve is ``W @ A`` for the
  per-seed accuracies ``A [S, G]``; ``W = 1/S`` gives the point estimate and ``W = I`` each seed
  against its own reference run.
- **Intervals**: the resampled statistic's percentiles by numpy's ``inverted_cdf`` method (the
  empirical distribution's quantile, an order statistic: of 2000 resamples the 2.5% point is the
  50th smallest and the 97.5% point the 1950th). A resample in which the method never reaches the
  target gives a step ratio of ∞ and a speed-up of 0, and is counted as "never".
- **Spreads** are sample standard deviations (ddof = 1).
- **Sensitivity of the step ratio to gain**: the same figure (its seed-mean curves, its paired
  bootstrap, the same resamples) at each ``q`` of :data:`SENSITIVITY_Q` and each final-level window
  of :data:`SENSITIVITY_WINDOWS`. It shows how much the figure depends on those two choices; the
  figure itself stays the one at the comparison's own ``q`` and window.
- **Per-seed step ratio** (a secondary figure): each seed's steps to ``q`` of its own reference
  run's gain over that run's (``W = I``), summarised by the geometric mean over seeds,
  ``exp(mean(log r_s))``, with a bootstrap interval over seeds (a resample's geometric mean of the
  seeds it drew, as often as it drew them). A seed on which the method never reaches the target
  has ``r_s = ∞``, one on which only the reference never does ``r_s = 0``: a mean holding the one
  is ∞ (counted as never), the other 0, both undefined; a seed on which neither reaches it is left
  out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

Q = 0.9
"""The fraction of the reference's gain a method is timed to."""
WINDOW = 3
"""The evaluations whose mean is a curve's final level."""
RESAMPLES = 2000
LEVEL = 0.95
SENSITIVITY_Q = (0.8, 0.9, 0.95)
SENSITIVITY_WINDOWS = (3, 5)


class Curve(NamedTuple):
    """One seed's run."""
    steps: np.ndarray        # [E] evaluation steps, increasing
    accuracy: np.ndarray     # [E] held-out accuracy at them
    clock_steps: np.ndarray  # [K] steps with a clock reading, increasing
    seconds: np.ndarray      # [K] training seconds at them


class Runs(NamedTuple):
    """A method's seeds on common step grids (:func:`align`)."""
    steps: np.ndarray         # [G] evaluation steps
    accuracy: np.ndarray      # [S, G] each seed's accuracy at them
    eval_seconds: np.ndarray  # [S, G] each seed's training seconds at them
    clock_steps: np.ndarray   # [K] steps with a clock reading
    seconds: np.ndarray       # [S, K] each seed's training seconds at them


def curve(evals: list[dict], records: list[dict] = (), key: str = "train_seconds") -> Curve:
    """A :class:`Curve` from metrics records (``step``, ``key``, ``eval_accuracy``): ``evals`` are
    the evaluations, ``records`` any further records with a clock reading (the steps')."""
    accuracy = {e["step"]: e["eval_accuracy"] for e in evals}
    clock = {r["step"]: r[key] for r in (*evals, *records)}
    steps, ks = sorted(accuracy), sorted(clock)
    return Curve(np.array(steps, float), np.array([accuracy[s] for s in steps], float),
                 np.array(ks, float), np.array([clock[s] for s in ks], float))


def align(curves: list[Curve]) -> Runs:
    """Every seed read, linearly between its points, at every evaluation (clock) step of any seed
    up to the shortest seed's last one: linear interpolation at a superset of a seed's own points
    leaves its curve as it was."""
    def grid(points):
        end = min(p[-1] for p in points)
        union = np.unique(np.concatenate(points))
        return union[union <= end]

    steps, clock_steps = grid([c.steps for c in curves]), grid([c.clock_steps for c in curves])
    return Runs(steps, np.stack([np.interp(steps, c.steps, c.accuracy) for c in curves]),
                np.stack([np.interp(steps, c.clock_steps, c.seconds) for c in curves]),
                clock_steps, np.stack([np.interp(clock_steps, c.clock_steps, c.seconds) for c in curves]))


def bootstrap_weights(seeds: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """``W [R, S]``: row r weighs each seed by how often resample r drew it, over ``seeds``."""
    drawn = np.random.default_rng(seed).integers(0, seeds, size=(resamples, seeds))  # [R, S] seed indices
    weights = np.zeros((resamples, seeds))
    np.add.at(weights, (np.arange(resamples)[:, None], drawn), 1.0 / seeds)
    return weights


def interp_rows(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Row r of ``fp [R, P]`` (drawn linearly over ``xp``, [P] or [R, P], increasing) read at
    ``x[r]`` ([R]; NaN stays NaN)."""
    xp = np.broadcast_to(xp, fp.shape)
    i = np.clip((xp <= x[:, None]).sum(1), 1, xp.shape[1] - 1)[:, None]  # [R, 1] right end of x's segment
    x0, x1 = np.take_along_axis(xp, i - 1, 1)[:, 0], np.take_along_axis(xp, i, 1)[:, 0]
    f0, f1 = np.take_along_axis(fp, i - 1, 1)[:, 0], np.take_along_axis(fp, i, 1)[:, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x1 > x0, f0 + (f1 - f0) * (x - x0) / (x1 - x0), f0)


def reach(x: np.ndarray, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Where each row of ``y [R, P]``, drawn linearly over ``x`` ([P] or [R, P]), first reaches
    ``target[r]``: ``x0 + (x1 - x0) (target - y0) / (y1 - y0)`` on the first segment that ends at or
    above it, the first point where that is already there; NaN where it never does."""
    x = np.broadcast_to(x, y.shape)
    hit = y >= target[:, None] - 1e-12
    first = hit.argmax(1)[:, None]  # [R, 1]
    before = np.maximum(first - 1, 0)
    x0, x1 = np.take_along_axis(x, before, 1)[:, 0], np.take_along_axis(x, first, 1)[:, 0]
    y0, y1 = np.take_along_axis(y, before, 1)[:, 0], np.take_along_axis(y, first, 1)[:, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        at = np.where(first[:, 0] == 0, x1, x0 + (x1 - x0) * (target - y0) / (y1 - y0))
    return np.where(hit.any(1), at, np.nan)


def area_mean(x: np.ndarray, y: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The mean of each row of ``y [R, P]``, drawn linearly over ``x`` ([P] or [R, P]), from
    ``x``'s first point to ``end[r]``: its area there (trapezoids) over the length."""
    x = np.broadcast_to(x, y.shape)
    inside = x <= end[:, None]
    xs = np.where(inside, x, end[:, None])  # points past the end collapse onto it
    ys = np.where(inside, y, interp_rows(end, x, y)[:, None])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.trapezoid(ys, xs, axis=1) / (end - x[:, 0])


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` of steps or times to a target, NaN meaning never: never over
    reached is ∞, reached over never 0, never over never NaN (undefined), 0 over 0 is 1."""
    numerator, denominator = np.asarray(numerator, float), np.asarray(denominator, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where((numerator == 0) & (denominator == 0), 1.0, numerator / denominator)
    r = np.where(np.isnan(numerator) & ~np.isnan(denominator), np.inf, r)
    return np.where(~np.isnan(numerator) & np.isnan(denominator), 0.0, r)


def final_level(accuracy: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Mean of the last ``window`` points of each row of ``accuracy [R, G]``."""
    return accuracy[:, -window:].mean(1)


def measures(reference: Runs, method: Runs, weights: np.ndarray, q: float = Q, window: int = WINDOW) -> dict:
    """Every figure of ``method`` against ``reference`` (the same seeds, in the same order) on the
    seed-mean curves of each row of ``weights [R, S]``: a dict of [R] arrays. For each target,
    ``gain`` (q of the reference's gain) and ``peak`` (the paper's: the reference's maximum):
    ``steps_to_*``, ``time_to_*`` and the reference's own, ``step_ratio_to_*`` (the method's steps
    over the reference's) and ``speedup_to_*`` (the reference's time over the method's); the
    ``target_*`` accuracies; ``mean_accuracy_steps``/``_time`` and ``final_level``, each with the
    reference's and the difference (``*_diff``: method minus reference)."""
    ref_acc, acc = weights @ reference.accuracy, weights @ method.accuracy  # [R, G_ref], [R, G]
    ref_clock, clock = weights @ reference.seconds, weights @ method.seconds  # [R, K_ref], [R, K]
    base, ref_final = ref_acc[:, 0], final_level(ref_acc, window)
    out = {"base_accuracy": base, "target_gain": base + q * (ref_final - base), "target_peak": ref_acc.max(1)}
    for name in ("gain", "peak"):
        ref_steps, steps = reach(reference.steps, ref_acc, out[f"target_{name}"]), reach(method.steps, acc, out[f"target_{name}"])
        ref_time = interp_rows(ref_steps, reference.clock_steps, ref_clock)
        time = interp_rows(steps, method.clock_steps, clock)
        gains = out[f"target_{name}"] > base  # a reference that gains nothing sets no target to be timed to
        undefined = lambda r: np.where(gains, r, np.nan)
        out |= {f"steps_to_{name}": steps, f"reference_steps_to_{name}": ref_steps,
                f"step_ratio_to_{name}": undefined(ratio(steps, ref_steps)), f"time_to_{name}": time,
                f"reference_time_to_{name}": ref_time, f"speedup_to_{name}": undefined(ratio(ref_time, time))}
    rows = len(weights)
    end = np.full(rows, min(reference.steps[-1], method.steps[-1]))
    ref_seconds, seconds = weights @ reference.eval_seconds, weights @ method.eval_seconds  # [R, G]: x of the time curves
    budget = np.minimum(ref_seconds[:, -1], seconds[:, -1])  # the shorter method's time budget
    for name, ref_value, value in [
        ("mean_accuracy_steps", area_mean(reference.steps, ref_acc, end), area_mean(method.steps, acc, end)),
        ("mean_accuracy_time", area_mean(ref_seconds, ref_acc, budget), area_mean(seconds, acc, budget)),
        ("final_level", ref_final, final_level(acc, window)),
    ]:
        out |= {name: value, f"reference_{name}": ref_value, f"{name}_diff": value - ref_value}
    return out


class Estimate(NamedTuple):
    """A figure on the seed means, its paired bootstrap interval (None with fewer than two seeds)
    and how many resamples (of ``resamples``) never reach the target (None for a difference)."""
    value: float
    low: float | None
    high: float | None
    never: int | None
    resamples: int


def interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """The ``level`` percentile interval of resampled values (``inverted_cdf``), the undefined
    (NaN) left out; None where none is defined."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    tail = round((1 - level) / 2, 12)  # 0.025, not 0.025000000000000022: 50 of 2000, not 51
    low, high = np.quantile(values, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def estimate(point: np.ndarray, resampled: np.ndarray | None, never: np.ndarray | None = None,
             level: float = LEVEL) -> Estimate:
    """An :class:`Estimate` from a statistic at ``W = 1/S`` (``point``, [1]) and over resamples
    (``resampled``, [R]; None: no interval); ``never`` [R] marks the resamples that never reach."""
    ci = interval(resampled, level) if resampled is not None else None
    return Estimate(float(point[0]), *(ci or (None, None)),
                    int(never.sum()) if never is not None and resampled is not None else None,
                    len(resampled) if resampled is not None else 0)


def each_seed(reference: list[Curve], method: list[Curve], q: float = Q, window: int = WINDOW) -> dict:
    """:func:`measures` of each seed against its own reference run, on the two runs' whole curves
    (not cut, as the seed means are, at the shortest seed's last evaluation): {name: [S] array}."""
    rows = [measures(align([r]), align([m]), np.ones((1, 1)), q, window) for r, m in zip(reference, method)]
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def compare_runs(reference: Runs, method: Runs, q: float = Q, window: int = WINDOW, resamples: int = RESAMPLES,
                 level: float = LEVEL, seed: int = 0) -> dict[str, Estimate]:
    """:func:`measures` on the seed means, as an :class:`Estimate` of each figure with its paired
    bootstrap interval (none with fewer than two seeds); per seed: :func:`each_seed`."""
    seeds = len(method.accuracy)
    point = measures(reference, method, np.full((1, seeds), 1.0 / seeds), q, window)
    resampled = (measures(reference, method, bootstrap_weights(seeds, resamples, seed), q, window)
                 if seeds > 1 and resamples > 0 else None)
    estimates = {}
    for name in point:
        target = name.rsplit("_to_", 1)[-1] if "_to_" in name and not name.startswith("reference_") else None
        never = np.isnan(resampled[f"steps_to_{target}"]) if resampled is not None and target else None
        estimates[name] = estimate(point[name], resampled[name] if resampled is not None else None, never, level)
    return estimates


def ratio_between(reference: Runs, a: Runs, b: Runs, key: str = "steps_to_gain", q: float = Q, window: int = WINDOW,
                  resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """``a``'s ``key`` (a ``steps_to_*`` or ``time_to_*``) over ``b``'s, both against ``reference``,
    the three resampled together (the same seeds); ``never`` counts the resamples where either
    never reaches the target (``a``: ∞; ``b``: 0; both: undefined, left out of the interval)."""
    seeds = len(a.accuracy)
    point = ratio(measures(reference, a, np.full((1, seeds), 1.0 / seeds), q, window)[key],
                  measures(reference, b, np.full((1, seeds), 1.0 / seeds), q, window)[key])
    if seeds < 2:
        return estimate(point, None)
    weights = bootstrap_weights(seeds, resamples, seed)
    first, second = measures(reference, a, weights, q, window)[key], measures(reference, b, weights, q, window)[key]
    return estimate(point, ratio(first, second), np.isnan(first) | np.isnan(second), level)


def difference_between(reference: Runs, a: Runs, b: Runs, key: str = "mean_accuracy_steps", q: float = Q,
                       window: int = WINDOW, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """``a``'s ``key`` (``mean_accuracy_steps``, ``mean_accuracy_time``, ``final_level``) minus
    ``b``'s, each over the budget it shares with ``reference``, resampled together."""
    seeds = len(a.accuracy)
    uniform = np.full((1, seeds), 1.0 / seeds)
    point = measures(reference, a, uniform, q, window)[key] - measures(reference, b, uniform, q, window)[key]
    if seeds < 2:
        return estimate(point, None)
    weights = bootstrap_weights(seeds, resamples, seed)
    return estimate(point, measures(reference, a, weights, q, window)[key] - measures(reference, b, weights, q, window)[key],
                    level=level)


def sensitivity(reference: Runs, method: Runs, qs=SENSITIVITY_Q, windows=SENSITIVITY_WINDOWS, resamples: int = RESAMPLES,
                level: float = LEVEL, seed: int = 0) -> dict[tuple[float, int], Estimate]:
    """The step ratio to gain (:func:`measures`' ``step_ratio_to_gain``) at every ``q`` of ``qs``
    and final-level window of ``windows``, each with its paired bootstrap interval on the same
    resamples as :func:`compare_runs` (the cell at its ``q`` and window is its figure):
    ``{(q, window): Estimate}``."""
    seeds = len(method.accuracy)
    uniform = np.full((1, seeds), 1.0 / seeds)
    weights = bootstrap_weights(seeds, resamples, seed) if seeds > 1 and resamples > 0 else None
    cells = {}
    for q in qs:
        for window in windows:
            point = measures(reference, method, uniform, q, window)["step_ratio_to_gain"]
            if weights is None:
                cells[q, window] = estimate(point, None)
                continue
            resampled = measures(reference, method, weights, q, window)
            cells[q, window] = estimate(point, resampled["step_ratio_to_gain"], np.isnan(resampled["steps_to_gain"]), level)
    return cells


def geometric_mean(ratios: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The geometric mean of per-seed ratios ``[S]`` (0 to ∞; NaN: undefined, left out) under each
    row of ``weights [R, S]``: ``exp(sum_s w_s log r_s / sum_s w_s)`` over the defined seeds. A row
    holding a ratio of ∞ (and none of 0) is ∞, one of 0 (and none of ∞) is 0, both: NaN; a row
    with no defined seed: NaN."""
    defined = ~np.isnan(ratios)  # [S]
    with np.errstate(divide="ignore"):
        logs = np.log(np.where(defined, ratios, 1.0))  # [S], ±∞ for ∞ and 0
    w = np.where(defined, weights, 0.0)  # [R, S]
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(w > 0, w * logs, 0.0)  # a seed not drawn adds nothing, even at ±∞
        return np.exp(terms.sum(1) / w.sum(1))


def per_seed_step_ratio(reference: Runs, method: Runs, q: float = Q, window: int = WINDOW, resamples: int = RESAMPLES,
                        level: float = LEVEL, seed: int = 0) -> tuple[np.ndarray, Estimate]:
    """Each seed's step ratio to ``q`` of its own reference run's gain ([S]) and their geometric
    mean with its interval (:func:`geometric_mean_estimate`)."""
    seeds = len(method.accuracy)
    ratios = measures(reference, method, np.eye(seeds), q, window)["step_ratio_to_gain"]  # [S]
    return ratios, geometric_mean_estimate(ratios, resamples, level, seed)


def geometric_mean_estimate(ratios: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """The geometric mean of per-seed ratios ([S]), with its bootstrap interval over seeds (the
    resamples of :func:`bootstrap_weights`); ``never`` counts the resamples that drew a seed whose
    ratio is infinite (the method never reaches its target)."""
    seeds = len(ratios)
    point = geometric_mean(ratios, np.full((1, seeds), 1.0 / seeds))
    if seeds < 2 or resamples <= 0:
        return estimate(point, None)
    weights = bootstrap_weights(seeds, resamples, seed)
    never = (weights[:, np.isinf(ratios)] > 0).any(1)
    return estimate(point, geometric_mean(ratios, weights), never, level)


def mean_of(values) -> float | None:
    """The mean of the values that are neither None nor NaN; None where there are none."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    return float(np.mean(values)) if values else None


def sample_sd(values) -> float | None:
    """The sample standard deviation (ddof = 1) of the values that are not None; None below two."""
    values = [v for v in values if v is not None]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None
