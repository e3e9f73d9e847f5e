"""``WorkerPool(transport="ray")``: the same workers as Ray actors on a local Ray cluster,
with the process workers' guarantees: what one process gives, and a killed actor's group
run again elsewhere, every (example, rollout) once. The ray tier: ``python3 dev.py ray``."""

from __future__ import annotations

import asyncio

import pytest

import vf_mm as vf
from tests.workers import _clients
from tests.workers.test_pool import ENV, spec
from vf_mm.testing import build_tiny_vlm
from vf_mm.workers import WorkerPool

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("ray") / "qwen", "qwen2_5_vl"))


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    ray = pytest.importorskip("ray")  # the tier's venv has it; the default tier deselects these
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run_on_ray(spec, workers=2):
    env = vf.load_environment(ENV)
    handed = []

    async def main():
        async with WorkerPool(spec, workers, transport="ray") as pool:
            await pool.evaluate(env, rows=env.get_eval_dataset(), rollouts_per_example=2, seed=3,
                                on_result=lambda o, i: handed.append((o.example_id, i, o)))  # fmt: skip
            return pool

    return handed, asyncio.run(main())


def test_ray_actors_give_what_one_process_gives(checkpoint):
    handed, pool = run_on_ray(spec(checkpoint))
    results = {(e, i): o for e, i, o in handed}
    assert len(handed) == len(results) == 16
    env = vf.load_environment(ENV)
    local = asyncio.run(env.evaluate(_clients.scripted(checkpoint), rollouts_per_example=2, seed=3))
    by_example: dict = {}
    for output in local:
        by_example.setdefault(output.example_id, []).append(output)
    for (example_id, _), output in results.items():
        assert output.error is None and output.reward == 1.0
        assert output.completion in [o.completion for o in by_example[example_id]]
    assert pool.stats.turns == 32


def test_a_killed_actor_loses_nothing_and_repeats_nothing(checkpoint, tmp_path):
    marker = tmp_path / "died"
    handed, pool = run_on_ray(spec(checkpoint, die_once_on="3", marker=str(marker)))
    results = {(e, i): o for e, i, o in handed}
    assert marker.exists() and pool.lost_groups >= 1
    assert len(handed) == len(results) == 16
    assert all(o.error is None for o in results.values())


def test_an_actor_that_cannot_start_stops_the_run_with_its_error(checkpoint):
    from vf_mm.errors import WorkerStartError

    with pytest.raises(WorkerStartError, match="this worker's client cannot be built"):
        run_on_ray(spec(checkpoint, fail_start=True))
