"""hycache's exact router without servers: whom it asks (the event view's workers only), how it
ranks, and how Dynamo's overlap answer reads (no Dynamo needed: the clients are fakes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from hypothesis import given
from hypothesis import strategies as st

from hycache.fleet.router import Answer, ExactRouter, by_bound, overlap_tokens, ranked


class FakeResumeClient:
    """The workers' `resume_point` endpoint: each worker's resume point, and who was asked."""

    def __init__(self, points: Mapping[int, int]) -> None:
        self.points = dict(points)
        self.asked: list[int] = []

    def instance_ids(self) -> list[int]:
        return list(self.points)

    async def direct(self, request: dict, worker_id: int) -> AsyncIterator[dict]:
        self.asked.append(worker_id)

        async def one() -> AsyncIterator[dict]:
            yield {"resume_point": self.points[worker_id], "running": 0, "waiting": 0}

        return one()


def choose(points: dict[int, int], published: dict[int, int] | None) -> tuple[list[Answer], list]:
    client = FakeResumeClient(points)

    async def view(_: list[int]) -> Mapping[int, int]:
        assert published is not None
        return published

    router = ExactRouter(client, None, 1.0, None if published is None else view)
    answers, asked = asyncio.run(router.choose([1, 2, 3]))
    assert asked == len(client.asked) == router.questions
    return answers, sorted(client.asked)


def test_the_event_view_asks_only_workers_with_a_published_unit() -> None:
    points = {10: 0, 11: 48, 12: 0, 13: 16}
    answers, asked = choose(points, {11: 64, 13: 16})
    assert asked == [11]  # its exact 48 beats 13's bound (16): 13 is not asked
    assert answers[0] == Answer(11, 48, 0)  # the exact answer, not the published 64
    assert [a.worker_id for a in answers] == [11, 13, 10, 12]


def test_a_bound_that_reaches_the_first_answer_is_asked() -> None:
    """The deepest published path overcounts (a request leaving it between two states): the
    next worker's bound reaches the first's exact answer, so it is asked, and wins."""
    points = {1: 16, 2: 32, 3: 0}
    answers, asked = choose(points, {1: 64, 2: 48})
    assert asked == [1, 2]
    assert answers[0] == Answer(2, 32, 0)


def test_a_request_nobody_holds_asks_nobody_and_spreads() -> None:
    firsts = []
    client = FakeResumeClient({1: 0, 2: 0, 3: 0})

    async def view(_: list[int]) -> Mapping[int, int]:
        return {}

    router = ExactRouter(client, None, 1.0, view)
    for _ in range(3):
        answers, asked = asyncio.run(router.choose([5]))
        assert asked == 0
        firsts.append(answers[0].worker_id)
    assert client.asked == [] and sorted(firsts) == [1, 2, 3]


def test_without_a_view_every_worker_is_asked() -> None:
    points = {1: 0, 2: 32, 3: 0}
    answers, asked = choose(points, None)
    assert asked == [1, 2, 3] and answers[0].worker_id == 2


@given(
    st.dictionaries(st.integers(0, 9), st.integers(0, 8), min_size=1),
    st.data(),
)
def test_the_view_changes_no_choice_when_it_bounds_the_resume_points(
    units: dict[int, int], data: st.DataObject
) -> None:
    """Published depths at or above every resume point (what resumable events guarantee):
    the worker chosen and the resume point it was chosen by are the ones asking everyone
    gives; no worker with nothing published is asked."""
    points = {w: u * 16 for w, u in units.items()}
    extra = data.draw(st.lists(st.integers(0, 3), min_size=len(points), max_size=len(points)))
    published = {w: p + e * 16 for (w, p), e in zip(points.items(), extra, strict=True) if p + e}
    with_view, asked = choose(points, published)
    without, _ = choose(points, None)
    assert with_view[0] == without[0]
    assert set(asked) <= set(published)
    assert sorted(a.worker_id for a in with_view) == sorted(points)
    assert [w for w, _ in by_bound(sorted(points), published, {}, 1.0)] == sorted(
        published, key=lambda w: (-published[w], w)
    )


def test_ranked_prefers_depth_then_load() -> None:
    answers = [Answer(1, 32, 0), Answer(2, 32, 2), Answer(3, 0, 0)]
    assert [a.worker_id for a in ranked(answers, 1.0, 0)] == [1, 2, 3]


def test_overlap_tokens_reads_device_blocks() -> None:
    scores = {
        "block_size": 16,
        "workers": [
            {"worker_id": 7, "dp_rank": 0, "device_blocks": 3, "host_pinned_blocks": 3},
            {"worker_id": 9, "dp_rank": 0, "device_blocks": 0},
        ],
    }
    assert overlap_tokens(scores, 16) == {7: 48, 9: 0}
    assert overlap_tokens({"workers": []}, 16) == {}
