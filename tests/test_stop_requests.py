"""sf.processes.control.StopRequests: which SIGINT/SIGTERM deliveries count as another request to stop."""
import signal

from sf.processes.control import REPEAT_GAP_SEC, StopRequests


def counted(deliveries):
    requests = StopRequests()
    return [requests.receive(sig, now=t) for sig, t in deliveries], requests.count


def test_first_signal_of_either_kind_is_a_request():
    assert counted([(signal.SIGTERM, 0.0)]) == ([True], 1)
    assert counted([(signal.SIGINT, 0.0)]) == ([True], 1)


def test_same_request_delivered_twice_at_once_counts_once():
    # timeout(1): to the process, then to its process group; a terminal's Ctrl-C: to the foreground group
    assert counted([(signal.SIGTERM, 0.0), (signal.SIGTERM, 1e-5)]) == ([True, False], 1)
    assert counted([(signal.SIGINT, 0.0), (signal.SIGINT, REPEAT_GAP_SEC / 2)]) == ([True, False], 1)


def test_later_ctrl_c_escalates_sigterm_never_does():
    later = REPEAT_GAP_SEC * 2
    assert counted([(signal.SIGINT, 0.0), (signal.SIGINT, later)]) == ([True, True], 2)
    assert counted([(signal.SIGTERM, 0.0), (signal.SIGINT, later)]) == ([True, True], 2)
    assert counted([(signal.SIGTERM, 0.0), (signal.SIGTERM, later),
                    (signal.SIGTERM, 60.0)]) == ([True, False, False], 1)
    assert counted([(signal.SIGINT, 0.0), (signal.SIGTERM, later)]) == ([True, False], 1)


def test_the_gap_is_measured_from_the_last_counted_request():
    g = REPEAT_GAP_SEC
    assert counted([(signal.SIGINT, 0.0), (signal.SIGINT, 0.6 * g), (signal.SIGINT, 1.2 * g),
                    (signal.SIGINT, 2.4 * g)]) == ([True, False, True, True], 3)
