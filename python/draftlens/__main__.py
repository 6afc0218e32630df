"""``python -m draftlens ARGS``: the same as running ``draftlens ARGS``."""

import os
import sys

from draftlens import find_draftlens_bin


def main() -> None:
    exe = find_draftlens_bin()
    if sys.platform == "win32":
        import subprocess

        sys.exit(subprocess.call([exe, *sys.argv[1:]]))
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
