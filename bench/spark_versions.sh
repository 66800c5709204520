#!/usr/bin/env bash
# The same Headrace on two PySpark versions, side by side in one run (the machine is noisy:
# compare within one run of this script): latency of a trickle, throughput, TaskManager-kill
# failover and the demo, alternating the two versions ROUNDS times.
#
#   bench/spark_versions.sh COMMIT VERSION_A VERSION_B [ROUNDS]
#   e.g. bench/spark_versions.sh dccdeaf 4.3.0 4.2.0 1
#   BENCHES="latency failover" bench/spark_versions.sh ...   (default: latency throughput failover demo)
#
# COMMIT is checked out into a temporary worktree and both sides run its code, so only Spark
# differs (choose a commit from before the connector jars, which are built for one Spark line).
# Each version gets a virtualenv beside the system's packages with only pyspark==VERSION in it
# (~/.cache/headrace/venvs/pyspark-VERSION, made once) and its own class archive. Drivers run as
# the benchmark's own user on both sides (HEADRACE_DRIVER_USER=""): a venv under root's home is
# not for the drivers' users to read.
set -euo pipefail
cd "$(dirname "$0")/.."
export HEADRACE_DRIVER_USER=""
commit=${1:?usage: bench/spark_versions.sh COMMIT VERSION_A VERSION_B [ROUNDS]}
versions=("${2:?VERSION_A}" "${3:?VERSION_B}")
rounds=${4:-1}
tree=$(mktemp -d -t headrace-versions-XXXXXX)
git worktree add --detach -f "$tree" "$commit" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
python_for() {
  local v=$1 venv=~/.cache/headrace/venvs/pyspark-$1
  if [ "$(python3 -c 'import pyspark; print(pyspark.__version__)')" = "$v" ]; then echo python3; return; fi
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages "$venv" >&2
    "$venv/bin/pip" install -q "pyspark==$v" >&2
  fi
  echo "$venv/bin/python"
}
for v in "${versions[@]}"; do
  py=$(python_for "$v")
  (cd "$tree" && $py -m services.taskmanager.runtime.class_archive --ensure >&2 || true)
done
for i in $(seq "$rounds"); do
  for v in "${versions[@]}"; do
    py=$(python_for "$v")
    echo "=== PySpark $v ($($py -c 'import pyspark; print(pyspark.__version__)')), round $i, $(date +%T)"
    for b in ${BENCHES:-latency throughput failover demo}; do
      echo "--- $b"
      (cd "$tree" && PATH="$(dirname "$(command -v "$py")"):$PATH" && export PATH && case $b in
        latency) $py bench/latency.py --kinds headrace --duration-s 60 2>&1 | grep -E '^headrace ' ;;
        throughput) $py bench/throughput.py --events 3000000 --rounds 1 2>&1 | grep -E 'events/s|ev/s' | tail -4 ;;
        failover) $py bench/failover.py --kind pyspark --runs 3 2>&1 | grep -E '^\| [0-9]|median|p50' | tail -5 ;;
        demo) $py bench/demo_start.py --runs 1 --variants after 2>&1 | tail -4 ;;
      esac) || echo "$b: no result"
    done
  done
done
