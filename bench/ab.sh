#!/usr/bin/env bash
# Any benchmark side by side: this checkout against an earlier commit, alternating runs on the
# same machine (it is noisy: compare within one run of this script).
#
#   bench/ab.sh BASE_COMMIT PAIRS COMMAND...
#   bench/ab.sh main 2 python3 bench/kafka_bench.py latency --rounds 1 --kinds latency-mode
#
# BASE_COMMIT is checked out into a temporary worktree; each side runs COMMAND from its own tree
# (the services it starts import that tree's code), PAIRS times, "before" first. AB_GREP (an
# extended regex) keeps only the matching lines of each run's output. The worktree is removed at
# the end. bench/failover_ab.sh is the failover benchmark's shorthand.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/ab.sh BASE_COMMIT PAIRS COMMAND...}
pairs=${2:?usage: bench/ab.sh BASE_COMMIT PAIRS COMMAND...}
shift 2
[ $# -gt 0 ] || { echo "usage: bench/ab.sh BASE_COMMIT PAIRS COMMAND..." >&2; exit 2; }
tree=$(mktemp -d -t headrace-ab-XXXXXX)
chmod 755 "$tree"  # the drivers' users run code from it
git worktree add --detach -f "$tree" "$base" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
for i in $(seq "$pairs"); do
  for side in before after; do
    dir=$PWD; [ "$side" = before ] && dir=$tree
    echo "=== $side ($(git -C "$dir" rev-parse --short HEAD)), pair $i, $(date +%T)"
    if [ -n "${AB_GREP:-}" ]; then
      (cd "$dir" && "$@" 2>&1 | grep -E "$AB_GREP" || echo "(no line matched AB_GREP: run the command alone to see why)")
    else
      (cd "$dir" && "$@" 2>&1)
    fi
  done
done
