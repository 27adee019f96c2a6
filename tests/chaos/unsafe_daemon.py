"""A deliberately broken leaderd, for showing that the chaos checker can fail. TEST ONLY.

With ``LEADERD_UNSAFE_NO_FENCE=1`` the engine ignores its self-fence deadline:
a leader that was paused or cut off keeps answering "leader" until a request tells it
otherwise. The product never reads this variable; only this wrapper does.

    python -m tests.chaos.unsafe_daemon run --backend ... (the arguments of ``leaderd``)
"""

from __future__ import annotations

import os
import sys

from leaderd.election import state as election_state
from leaderd.startup.cli import main


def _leading_unfenced(self: election_state.ElectionState, now: float) -> bool:
    return self.held_term is not None and not self.stopping  # no `now < self.deadline`


# Taken out of the environment: leaderd refuses LEADERD_* variables it does not know.
if os.environ.pop("LEADERD_UNSAFE_NO_FENCE", None) == "1":
    election_state.ElectionState.leading = _leading_unfenced  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
