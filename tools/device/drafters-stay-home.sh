#!/usr/bin/env bash
# Keep drafters/ out of the working tree that a device call copies (64 MiB at most), without
# moving a file: `on` takes drafters/ out of git's index (the files stay on disk, so builds that
# embed them keep working) and ignores it through .git/info/exclude; `off` puts both back.
# The device machine never needs the shipped drafters: a call that evaluates them carries them.
#
#   tools/device/drafters-stay-home.sh on     # before a series of device calls
#   tools/device/drafters-stay-home.sh off    # after (always: a commit made in between with
#                                             # plain `git commit` would record drafters/ as deleted)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=.git/info/exclude
case ${1:-} in
on)
    git rm -r -q --cached drafters
    mkdir -p .git/info && echo '/drafters/' >>"$exclude"
    echo "drafters/ stays here for device calls; run '$0 off' afterwards"
    ;;
off)
    git reset -q -- drafters
    [[ -f $exclude ]] && sed -i '\#^/drafters/$#d' "$exclude"
    git diff --quiet --cached -- drafters && echo "drafters/ is tracked again"
    ;;
*)
    echo "usage: $0 on|off" >&2
    exit 2
    ;;
esac
