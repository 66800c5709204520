#!/usr/bin/env bash
# The just-started failover benchmark side by side: this checkout against an earlier commit,
# alternating runs on the same machine (it is noisy: compare within one run of this script).
#
#   bench/failover_ab.sh BASE_COMMIT [PAIRS]      e.g. bench/failover_ab.sh HEAD~1 2
#   FAILOVER_ARGS="--kind kafka --runs 1" bench/failover_ab.sh HEAD~2 3    (the warm drill, Kafka)
#
# BASE_COMMIT is checked out into a temporary worktree; each side runs
# `python3 bench/failover.py $FAILOVER_ARGS` (default `--case just-started --runs 1`) from its own
# tree (the services it starts import that tree's code), PAIRS times (default 2). The worktree is
# removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/failover_ab.sh BASE_COMMIT [PAIRS]}
pairs=${2:-2}
args=${FAILOVER_ARGS:---case just-started --runs 1}
tree=$(mktemp -d -t headrace-ab-XXXXXX)
chmod 755 "$tree"  # the drivers' users run code from it
git worktree add --detach -f "$tree" "$base" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
for i in $(seq "$pairs"); do
  for side in before after; do
    dir=$PWD; [ "$side" = before ] && dir=$tree
    echo "=== $side ($( [ "$side" = before ] && git rev-parse --short "$base" || git rev-parse --short HEAD)), pair $i, $(date +%T)"
    (cd "$dir" && python3 bench/failover.py $args 2>&1 | grep -E '^\| [0-9]|kill [12]:|^run [0-9]+:|"median' || echo "(this run printed no result line: run bench/failover.py alone to see why)")
  done
done
