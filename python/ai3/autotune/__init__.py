"""Algorithm exploration: the ``'auto'`` selector, its disk cache, plans, and
:func:`explore` with its report.

- :class:`Auto` (``'auto'``): time every algorithm that can run a layer on its
  real input shape and keep the fastest accurate one (:mod:`.auto`);
- measurements are cached on disk per layer signature and machine
  (:mod:`.cache`, :mod:`.signature`); :mod:`.timing` holds the shared
  timing pieces (random inputs, interleaved medians);
- a :class:`Plan` saves the choice of every layer and applies it later
  without timing (:mod:`.plan`); :mod:`.resolve` decides a converted model's
  layers from either;
- :func:`explore` (``ai3.explore``) times every algorithm of every layer next
  to PyTorch and returns a :class:`Report` (:mod:`.explorer`, :mod:`.report`).
"""

from __future__ import annotations

from .auto import STATS, Auto
from .cache import cache_dir
from .explorer import explore
from .plan import Plan, PlanLayer
from .report import Report

__all__ = ["Auto", "Plan", "PlanLayer", "Report", "STATS", "cache_dir", "explore"]
