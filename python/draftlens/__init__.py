"""draftlens: honest evaluation of speculative-decoding drafters.

The wheel installs the ``draftlens`` command-line tool (a Rust binary) into the environment's
scripts folder; this package finds it (``find_draftlens_bin``) and runs it (``python -m draftlens``).
The Python plugin SDK for metric authors ships in this package too (see plugins/README.md).
"""

import os
import sys
import sysconfig

__all__ = ["find_draftlens_bin"]


def find_draftlens_bin() -> str:
    """The path of the installed ``draftlens`` binary."""
    exe = "draftlens" + (sysconfig.get_config_var("EXE") or "")
    candidates = [sysconfig.get_path("scripts")]
    user = sysconfig.get_path("scripts", scheme=f"{os.name}_user") if sys.version_info >= (3, 10) else None
    if user:
        candidates.append(user)
    candidates.append(os.path.join(os.path.dirname(sys.executable)))
    for d in candidates:
        p = os.path.join(d, exe)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"draftlens binary not found in {candidates}")
