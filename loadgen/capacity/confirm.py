"""The confirming load steps: the ends of the capacity search's bracket measured again on fresh arrival draws.

Once the bracket has converged (or the step budget is spent), its pass end and then its fail end are
measured again, each with a fresh arrival pattern. A load's verdict is the majority of its counted
measurements (``search_steps.majority``; a tie counts as a failure: a rating must hold on most patterns).
A confirmation that disagrees makes a tie, which one more fresh draw breaks (``tie_break``); when the
majority turns against the end, the bracket reopens (a pass end that now fails, a fail end that now
passes) and the search bisects on from there. An end is *confirmed* when at least two of its
measurements, with different draws, agree with its verdict. After ``max_reopens`` reopenings the search
asks for no more confirmations: it converges and says the bracket is unconfirmed.
"""

from __future__ import annotations

from loadgen.capacity.search_steps import ArrivalDraws, Proposal, Step, majority, measured_at

MAX_REOPENS = 2  # confirmations that may disagree before the search stops confirming


def confirmed(steps: list[Step], load: float) -> bool:
    """At least two of the load's measurements, with different draws, agree with its verdict."""
    verdict = majority(steps, load)
    agree = {s.draw for s in measured_at(steps, load) if s.passed == verdict}
    return verdict is not None and len(agree) >= 2


def confirmation(steps: list[Step], lo: float, hi: float, draws: ArrivalDraws) -> Proposal | None:
    """The next end to measure again on a fresh draw: the pass end ``lo``, then the fail end ``hi``, until
    both are confirmed; None when they are."""
    for end, want in ((lo, True), (hi, False)):
        if not confirmed(steps, end):
            return Proposal(end, "confirm", draws.fresh(), want=want)
    return None


def tie_break(load: float, want: bool | None, draws: ArrivalDraws) -> Proposal:
    """One more confirmation of an end whose measurements are tied, on a fresh draw."""
    return Proposal(load, "confirm", draws.fresh(), want=want)
