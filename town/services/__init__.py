"""The town's business logic, as keyword-only services (HackSoft style).

runs: create and control runs; ticks: begin and finish a tick; decisions: dispatch, resend,
compute, time out, reroute and apply one resident's decision; choices: read what a decision chose.
"""

from town.services.choices import decision_choice, decision_parse
from town.services.decisions import (
    decision_apply,
    decision_compute,
    decision_dispatch,
    decision_fail,
    decision_reroute,
    decision_resend,
    decision_resend_due,
    decision_time_out,
    decision_wait_verdict,
)
from town.services.runs import (
    RUN_CONTROLS,
    run_control_statuses,
    run_controls_available,
    run_create,
    run_lease_release,
    run_lease_take,
    run_pause,
    run_resume,
    run_start,
    run_step,
    run_stop,
    served_model,
)
from town.services.ticks import tick_begin, tick_finish

__all__ = [
    "RUN_CONTROLS",
    "decision_apply",
    "decision_choice",
    "decision_compute",
    "decision_dispatch",
    "decision_fail",
    "decision_parse",
    "decision_reroute",
    "decision_resend",
    "decision_resend_due",
    "decision_time_out",
    "decision_wait_verdict",
    "run_control_statuses",
    "run_controls_available",
    "run_create",
    "run_lease_release",
    "run_lease_take",
    "run_pause",
    "run_resume",
    "run_start",
    "run_step",
    "run_stop",
    "served_model",
    "tick_begin",
    "tick_finish",
]
