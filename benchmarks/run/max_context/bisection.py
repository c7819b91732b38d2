"""The max-context search's algorithms over a probe (a whole GRPO step at one completion length): doubling
then bisection, and the model-guided search that reaches the same bracket in fewer probes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.catalog.profiles import ContextBench
from benchmarks.model.memory.predict import GIB


class ProbeFailed(RuntimeError):
    """A probe ended neither fitting nor out of memory (an error): the search cannot go on."""


def search(
    fits: Callable[[int], bool],
    start: int,
    ceiling: int,
    resolution: float,
    granule: int,
    passed: int | None = None,
    failed: int | None = None,
) -> tuple:
    """Doubling from ``start`` while ``fits`` (halving below it while not), then bisection until
    ``first_fail <= last_pass * (1 + resolution)`` (or a granule apart). Returns
    ``(last_pass, first_fail)``: None for a side never reached (nothing fits; the ceiling fits).
    ``passed`` / ``failed``: lengths already probed, to go on from."""
    if passed is not None and failed is None and passed >= ceiling:
        return passed, None
    if failed is not None and passed is None and failed <= granule:
        return None, failed
    if passed is None and failed is None:
        length = start
    elif failed is None:
        length = min(2 * passed, ceiling)
    else:
        length = max(granule, failed // 2 // granule * granule)
    while passed is None or failed is None:
        if fits(length):
            passed = length
            if failed is None:
                if length >= ceiling:
                    return passed, None
                length = min(2 * length, ceiling)
        else:
            failed = length
            if passed is None:
                if length <= granule:
                    return None, failed
                length = max(granule, length // 2 // granule * granule)
    while failed - passed > max(granule, passed * resolution):
        middle = round((passed + failed) / 2 / granule) * granule
        if middle in (passed, failed):
            break
        if fits(middle):
            passed = middle
        else:
            failed = middle
    return passed, failed


def guided_search(
    probe: Callable[[int], tuple[bool, int | None]],
    modelled: Callable[[int], int],
    budget: int,
    start: int,
    ceiling: int,
    resolution: float,
    granule: int,
) -> tuple:
    """The model-guided search, to the full search's bracket and resolution in fewer probes.

    ``probe(length)`` runs a step: (whether it fitted, its measured peak). ``modelled(length)`` is the
    analytic model's peak. After each probe the next length is the search's best guess of the boundary:
    a secant through the two longest fitting probes' measured peaks where their peaks grow, else the
    model anchored on the longest fitting probe (its peak plus the model's growth from there). Lengths
    lie on the granule grid, and a step is a resolution step as far as the grid allows. The probe is the
    length whose step up is centred on the guess, at least a step above the longest fit: where the guess
    is right it fits and the next probe, a step up, fails and closes the bracket. A guess past the first
    failing length goes a step under it (once: the model was nearly right), amid the lengths whose fit
    closes the bracket; otherwise a guess outside the bracket, or a bracket within two steps, is split in
    log space. Where ``start`` does not fit, lengths halve as in ``search``. Returns ``search``'s
    ``(last_pass, first_fail)``."""

    grid = _Grid(granule, resolution)
    fitting: list[tuple[int, int]] = []  # (length, measured peak) of every fitting probe
    passed = failed = None
    length, stepped_below = start, False
    while True:
        fits, peak = probe(length)
        if fits:
            passed = length
            if peak:
                fitting.append((length, peak))
        else:
            failed = length
        if passed is None:  # nothing fits yet: halve, as the full search does
            if length <= granule:
                return None, failed
            length = grid.down(length / 2)
            continue
        if failed is None and passed >= ceiling:
            return passed, None
        if failed is not None and (failed - passed <= granule or failed <= passed * (1 + resolution)):
            return passed, failed
        guess = _boundary_guess(sorted(fitting), modelled, budget, passed, failed or ceiling, granule)
        length, stepped_below = _next_probe(grid, guess, passed, failed, ceiling, stepped_below)


@dataclass(frozen=True)
class _Grid:
    """The lengths a search probes: multiples of ``granule``, a step up from a fit ``resolution`` long."""

    granule: int
    resolution: float

    def down(self, length: float) -> int:
        return max(self.granule, int(length) // self.granule * self.granule)

    def up(self, length: float) -> int:
        return max(self.granule, -int(-length // self.granule) * self.granule)

    def step_from(self, length: int) -> int:
        """The step up from a fitting length that closes the bracket."""
        return max(self.granule, self.down(length * (1 + self.resolution)) - length)


def _next_probe(
    grid: _Grid, guess: float, passed: int, failed: int | None, ceiling: int, stepped_below: bool
) -> tuple[int, bool]:
    """The next length to probe for the boundary ``guess``, and whether the search has now stepped under a
    failing length (see ``guided_search``)."""
    granule, resolution = grid.granule, grid.resolution
    high = failed if failed is not None else ceiling
    # on the granule grid: the shortest length a step above ``passed`` (a fit there moves the bracket by
    # a step) and, under ``failed``, the shortest whose fit closes the bracket
    lowest = max(passed + granule, grid.down(passed * (1 + resolution)))
    highest = high if failed is None else max(lowest, min(failed - granule, grid.up(failed / (1 + resolution))))
    if failed is not None and guess >= failed and not stepped_below:  # just past the guess: a step under,
        return grid.down((highest + failed - granule) / 2), True  # amid the lengths that close
    if failed is not None and (failed <= passed * (1 + resolution) ** 2 or not passed < guess < failed):
        guess = (passed * failed) ** 0.5
    if failed is None and guess >= ceiling:  # the ceiling itself is probed as it is
        return min(max(ceiling, lowest), highest), stepped_below
    # the length whose step up is centred on the guess: a right guess fits, and one step up fails
    nearby = range(grid.down(guess - grid.step_from(grid.down(guess))), grid.up(guess) + granule, granule)
    centred = min(nearby, key=lambda length: abs(length + grid.step_from(length) / 2 - guess))
    return min(max(centred, lowest), highest), stepped_below


def _boundary_guess(
    fitting: list[tuple[int, int]], modelled: Callable[[int], int], budget: int, passed: int, high: int, granule: int
) -> float:
    """Where the budget ends: the secant through the two longest fitting probes where their peaks grow,
    else the model anchored on the longest fitting probe (or ``passed`` where none has a peak)."""
    if len(fitting) >= 2 and fitting[-1][1] > fitting[-2][1]:
        (a, peak_a), (b, peak_b) = fitting[-2:]
        return b + (budget - peak_b) * (b - a) / (peak_b - peak_a)
    if not fitting:
        return float(passed)
    anchor, peak = fitting[-1]
    offset = peak - modelled(anchor)
    longest, _ = search(lambda n: offset + modelled(n) <= budget, anchor, high, 0.0, granule)
    if longest is None or longest >= high:
        return float(longest or anchor)
    below, above = offset + modelled(longest), offset + modelled(longest + granule)  # within the granule
    return longest + granule * min(1.0, (budget - below) / (above - below)) if above > below else float(longest)


def bracket(
    settings: ContextBench, probe: Callable[[int], tuple[bool, int | None]], modelled: Callable[[int], int]
) -> tuple:
    """The settings' search over ``probe``: its (last fitting, first failing) lengths."""
    bounds = (settings.start_tokens, settings.max_tokens, settings.resolution, settings.granule)
    if settings.search == "doubling":
        return search(lambda length: probe(length)[0], *bounds)
    return guided_search(probe, modelled, int(settings.budget_gib * GIB), *bounds)
