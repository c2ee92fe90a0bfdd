"""peft 0.21 imports bitsandbytes as it loads (peft/helpers.py; `from transformers import Trainer` imports peft) and
again as it wraps layers, and bitsandbytes imports torch's compiler: a cost every run that quantizes nothing would
pay. `bitsandbytes_hidden` hides it from peft where it is not needed. peft 0.22 no longer imports it as it loads,
but still as it wraps layers, through the same cached answers."""

from __future__ import annotations

import sys
from contextlib import contextmanager

LIBRARY = "peft"
VERSIONS = ">=0.21,<0.23"  # (0.22.0 checked: get_peft_model imports bitsandbytes unless hidden)


@contextmanager
def bitsandbytes_hidden(needed: bool):
    """Inside the block peft finds no bitsandbytes (unless it is `needed`, or imported already).

    Why: peft imports bitsandbytes as it loads (peft/helpers.py; `from transformers import Trainer`
    imports peft) and again as it wraps layers, and bitsandbytes imports torch's compiler, a cost every
    run that quantizes nothing would pay. A None entry in sys.modules makes that import
    fail and find_spec answer None. On the way out peft's and transformers' cached answers are
    cleared, so a quantized model later in the same process finds bitsandbytes again.
    """
    if needed or "bitsandbytes" in sys.modules:
        yield
        return
    sys.modules["bitsandbytes"] = None
    try:
        yield
    finally:
        sys.modules.pop("bitsandbytes", None)
        from peft import import_utils
        from transformers.utils import import_utils as transformers_imports

        for answer in (import_utils.is_bnb_available, import_utils.is_bnb_4bit_available,
                       transformers_imports.is_bitsandbytes_available):
            answer.cache_clear()


def still_needed() -> list[str]:
    """Whether peft still asks for bitsandbytes through the cached answers cleared above."""
    from peft import import_utils

    missing = [name for name in ("is_bnb_available", "is_bnb_4bit_available")
               if not hasattr(getattr(import_utils, name, None), "cache_clear")]
    return [f"peft.import_utils.{name} is no longer a cached function" for name in missing]
