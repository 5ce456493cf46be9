"""memprobe: will this training step fit in accelerator memory, and which remat strategy gets it
there cheapest? The library's public names; see ``memprobe.api`` and the README's "As a library".

    import memprobe
    result = memprobe.compare(seq=8192, batch=1, target="tpu7x",
                              strategies=["checkpoint", "scan-checkpoint"])
    for m in result.measurements:
        print(m.strategy, m.peak_bytes, m.fits)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each name is imported on first use: compile workers start as `python -m memprobe.compile`,
# and importing the API here would load that module before it runs as __main__. (No name
# here may be a submodule's: `import memprobe.render` would replace it.)
_PUBLIC = {
    "compare": "memprobe.api", "run": "memprobe.api", "resolve_plan": "memprobe.api",
    "load": "memprobe.api", "frame": "memprobe.api", "report": "memprobe.api", "check": "memprobe.api",
    "fit": "memprobe.api", "FitResult": "memprobe.search", "explain": "memprobe.api",
    "Explained": "memprobe.liveness", "Explanation": "memprobe.liveness",
    "Tolerance": "memprobe.gate", "Verdict": "memprobe.gate", "Checked": "memprobe.gate",
    "Result": "memprobe.result", "Measurement": "memprobe.measure", "Plan": "memprobe.plan",
    "Strategy": "memprobe.strategy", "Loop": "memprobe.strategy", "Policy": "memprobe.strategy",
    "load_strategy": "memprobe.strategy", "load_catalogue": "memprobe.strategy",
    "MemprobeError": "memprobe.errors", "BadInput": "memprobe.errors",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from memprobe.api import check, compare, explain, fit, frame, load, report, resolve_plan, run
    from memprobe.liveness import Explained, Explanation
    from memprobe.search import FitResult
    from memprobe.gate import Checked, Tolerance, Verdict
    from memprobe.errors import BadInput, MemprobeError
    from memprobe.measure import Measurement
    from memprobe.plan import Plan
    from memprobe.result import Result
    from memprobe.strategy import Loop, Policy, Strategy, load_catalogue, load_strategy


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'memprobe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
