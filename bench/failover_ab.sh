#!/usr/bin/env bash
# The just-started failover benchmark side by side: this checkout against an earlier commit,
# alternating runs on the same machine (bench/ab.sh; compare within one run of this script).
#
#   bench/failover_ab.sh BASE_COMMIT [PAIRS]      e.g. bench/failover_ab.sh HEAD~1 2
#   FAILOVER_ARGS="--kind kafka --runs 1" bench/failover_ab.sh HEAD~2 3    (the warm drill, Kafka)
#
# Each side runs `python3 bench/failover.py $FAILOVER_ARGS` (default `--case just-started
# --runs 1`) from its own tree, PAIRS times (default 2), and prints its result lines.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/failover_ab.sh BASE_COMMIT [PAIRS]}
pairs=${2:-2}
# shellcheck disable=SC2086 # FAILOVER_ARGS is a list of arguments
AB_GREP='^\| [0-9]|kill [12]:|^run [0-9]+:|"median' exec bench/ab.sh "$base" "$pairs" python3 bench/failover.py ${FAILOVER_ARGS:---case just-started --runs 1}
