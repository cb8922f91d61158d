"""Hypothesis example budgets per profile (the profiles live in conftest.py).

``ci`` (the default) is derandomized: every run draws the same examples, so a
red CI run is reproduced by running the test again, and a green one is not
luck. ``long`` (``python -m pytest --hypothesis-profile=long
--hypothesis-seed=N``) draws fresh examples from the seed, ten times as many:
the opt-in search for what the fixed draws miss.
"""

from __future__ import annotations

from hypothesis import settings

SCALE = {"ci": 1, "long": 10}


def examples(n: int) -> int:
    """`n` examples under ``ci``, ``SCALE`` times that under the active profile."""
    return n * SCALE.get(settings.get_current_profile_name(), 1)
