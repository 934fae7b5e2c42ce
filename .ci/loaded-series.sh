#!/usr/bin/env bash
# The flake check of issue 12: the README's test command N times in a row (default 3), each from a fresh clone of
# HEAD and a fresh venv, with two busy-loop processes (`python -c "while True: pass"`) beside it.
#
#   bash .ci/loaded-series.sh                  # 3 runs; results in $SERIES_DIR/summary.txt
#   SERIES_RUNS=1 bash .ci/loaded-series.sh
#
# Each clone is made beside this checkout (../loaded-series-runN), so `../shared/traces` resolves as it does here and
# the public-data tests run rather than skip; logs, the venv and summary.txt go to SERIES_DIR (../loaded-series). The real-vLLM tier runs when LOADGEN_VLLM_PYTHON
# is set (as .ci/run sets it); the `ray` extra is installed so the local-Ray tests run. Every run clones the commit
# HEAD had when the series started, so all runs test the same code. Exit status: 0 when every run passed.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
runs="${SERIES_RUNS:-3}"
dir="${SERIES_DIR:-$(dirname "$here")/loaded-series}"
test_cmd="${SERIES_TEST_CMD:-pip install -q -e '.[test]' && python -m pytest -q -p no:cacheprovider}"
commit="$(git -C "$here" rev-parse HEAD)"
mkdir -p "$dir"
export PIP_DISABLE_PIP_VERSION_CHECK=1
failed=0
for i in $(seq 1 "$runs"); do
  clone="$(dirname "$here")/loaded-series-run$i"
  rm -rf "$clone" "$dir/venv"
  git clone -q "$here" "$clone" && git -C "$clone" checkout -q "$commit"
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/python" -m pip install -q -e "$clone[test,ray]" > "$dir/install$i.log" 2>&1
  python3 -c "while True: pass" & busy1=$!
  python3 -c "while True: pass" & busy2=$!
  start=$(date +%s)
  (cd "$clone" && PATH="$dir/venv/bin:$PATH" bash -c "$test_cmd") > "$dir/run$i.log" 2>&1
  rc=$?
  kill "$busy1" "$busy2" 2>/dev/null
  wait "$busy1" "$busy2" 2>/dev/null
  [ "$rc" = 0 ] || failed=1
  echo "run $i of $runs on ${commit:0:7}: rc=$rc $(( $(date +%s) - start )) s: $(tail -n 1 "$dir/run$i.log")" \
    | tee -a "$dir/summary.txt"
done
exit "$failed"
