"""Coalescing wake-ups: how long after a claim further wake-ups are held and merged into one."""

from worker.daemon.worker import WAKE_QUIET_MAX_SECONDS, WAKE_QUIET_MIN_SECONDS, quiet_after_claim


def test_wake_ups_after_a_claim_that_found_rows_are_answered_at_once():
    assert quiet_after_claim(WAKE_QUIET_MAX_SECONDS, found_rows=True, by_notify=True) == 0.0


def test_the_window_starts_at_a_few_ms_and_doubles_while_claims_find_nothing_up_to_the_cap():
    windows = []
    quiet = 0.0
    for _ in range(12):
        quiet = quiet_after_claim(quiet, found_rows=False, by_notify=True)
        windows.append(quiet)
    assert windows[0] == WAKE_QUIET_MIN_SECONDS and windows[1] == 2 * WAKE_QUIET_MIN_SECONDS
    assert windows == sorted(windows) and windows[-1] == WAKE_QUIET_MAX_SECONDS
    # so a storm of wake-ups lasting ten seconds costs at most about 10 / cap claims, plus the ramp
    assert sum(1 for w in windows if w < WAKE_QUIET_MAX_SECONDS) <= 7


def test_an_empty_look_after_the_worker_s_own_finish_does_not_hold_the_next_notify():
    # one row at a time: every delivery's finish wakes the worker, which finds nothing; the
    # producer's next NOTIFY must still be answered at once
    assert quiet_after_claim(0.0, found_rows=False, by_notify=False) == 0.0
    # and it does not shorten a window NOTIFYs opened either
    widest = WAKE_QUIET_MAX_SECONDS
    assert quiet_after_claim(widest, found_rows=False, by_notify=False) == widest
