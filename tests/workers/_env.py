"""A small multi-turn environment with images, loaded by the workers from this file's
path (as ``vf-mm eval path/to/env.py`` loads one): each row's question names its example,
so a scripted backend (``_clients.py``) can act on one example in whichever worker runs it."""

from __future__ import annotations

import numpy as np
from PIL import Image

import vf_mm as vf


def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))


class Steps(vf.MultiTurnEnv):
    """Two model turns; the environment answers the first with a new picture."""

    async def env_response(self, messages, state):
        if state.get("unpicklable"):
            state["info"]["handle"] = (x for x in ())  # a generator: does not pickle
        return [{"role": "user", "content": [{"type": "image", "image": picture(100 + state["turn"])},
                                             {"type": "text", "text": "and now?"}]}]  # fmt: skip

    async def setup_state(self, state):
        state["unpicklable"] = state["info"].get("unpicklable", False)


def load_environment(num_examples: int = 8, unpicklable: tuple[int, ...] = ()):
    rows = [
        {"question": f"example q{i}.", "answer": "yes", "image": picture(i),
         "info": {"unpicklable": i in unpicklable}}
        for i in range(num_examples)
    ]  # fmt: skip
    rubric = vf.Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)])
    return Steps(dataset=rows, rubric=rubric, max_turns=2, env_id="steps")
