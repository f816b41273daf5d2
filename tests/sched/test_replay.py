"""`DryRunExecutor(accepted=...)`: recorded acceptances replayed, the rate elsewhere."""

from __future__ import annotations

from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, new_request


def _produced(executor: DryRunExecutor, max_tokens: int) -> list[int]:
    """Tokens per sampling step of one request, run alone to its end."""
    cfg = make_config(k=3)
    sched = Scheduler(cfg)
    sched.add_request(new_request(cfg, "r", list(range(40)), max_tokens=max_tokens))
    out: list[int] = []
    while sched.has_unfinished():
        step = sched.schedule()
        results = executor.execute(step)
        out += [len(results[s.request.request_id].sampled_token_ids) for s in step.scheduled
                if s.samples]  # fmt: skip
        sched.update(step, results)
    return out


def test_recorded_acceptances_are_replayed_capped_and_the_rate_fills_the_rest() -> None:
    # outputs before the step -> drafts accepted; 9 is more than the 3 drafts offered
    record = {"r": {0: 0, 1: 3, 5: 0, 6: 9}}
    got = _produced(DryRunExecutor(num_speculative_tokens=3, acceptance_rate=0.0,
                                   accepted=record), max_tokens=20)  # fmt: skip
    # prefill: 1 token; then 1 + 3; then 1 (recorded 0); then 1 + 3 (capped); then the
    # rate (0: one token a step) to the end
    assert got[:4] == [1, 4, 1, 4]
    assert set(got[4:]) == {1} and sum(got) == 20
    # no record: every step draws at the rate (1.0: all drafts, until max_tokens cuts)
    drawn = _produced(DryRunExecutor(num_speculative_tokens=3, acceptance_rate=1.0), 20)
    assert drawn[:3] == [1, 4, 4]
    # a record for another request changes nothing here
    other = DryRunExecutor(num_speculative_tokens=3, acceptance_rate=1.0, accepted={"x": {0: 0}})
    assert _produced(other, 20) == drawn
