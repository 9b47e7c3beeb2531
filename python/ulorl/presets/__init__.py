"""Drop-in presets: the frameworks' loss calls with their own option names, mapped onto ulorl's C++
presets (ulorl/presets/<framework>.hpp). A preset only chooses parameters (and the few genuine
formula variants the C++ presets name); the formulas are ulorl's kernels.

The frameworks' default normalisers are *local* (each micro-batch divides by its own token or
sequence count): partition-exact only when the global counts are passed (verl ``batch_num_tokens`` /
``global_batch_size``, OpenRLHF likewise, TRL ``num_items_in_batch``, NeMo-RL ``global_valid_toks``).
"""

from . import liger, nemo_rl, openrlhf, trl, verl  # noqa: F401

__all__ = ["liger", "nemo_rl", "openrlhf", "trl", "verl"]
