"""Algorithm exploration: the ``'auto'`` selector, its disk cache, and plans.

- :class:`Auto` (``'auto'``): time every algorithm that can run a layer on its
  real input shape and keep the fastest accurate one (:mod:`.auto`);
- measurements are cached on disk per layer signature and machine
  (:mod:`.cache`, :mod:`.signature`);
- a :class:`Plan` saves the choice of every layer and applies it later
  without timing (:mod:`.plan`); :mod:`.resolve` decides a converted model's
  layers from either.
"""

from __future__ import annotations

from .auto import STATS, Auto
from .cache import cache_dir
from .plan import Plan, PlanLayer

__all__ = ["Auto", "Plan", "PlanLayer", "STATS", "cache_dir"]
