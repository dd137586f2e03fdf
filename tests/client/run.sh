#!/usr/bin/env bash
# Starts `hetmoe serve` on a free loopback port with a tiny model, runs the OpenAI client test against it, then stops
# it with SIGTERM, which must end it with status 0. Exit 77 (skipped) without node or the openai package, unless CI
# is set: CI installs both (scripts/deps.sh).
set -uo pipefail
hetmoe=$1 model=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node > /dev/null || [[ ! -d $here/node_modules/openai ]]; then
  echo "node or the openai package is missing (scripts/deps.sh installs them)"
  [[ -n ${CI:-} ]] && exit 1
  exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$hetmoe" serve -m "$model" --port 0 -P 8 -t 2 --chat-template chatml --api-key test-key -a tiny 2> "$log" &
pid=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.* on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$log")
  [[ -n $port ]] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
if [[ -z $port ]]; then
  echo "the server did not start:"
  cat "$log"
  kill "$pid" 2> /dev/null
  exit 1
fi
node "$here/openai_client.mjs" "http://127.0.0.1:$port"
status=$?
kill -TERM "$pid"
wait "$pid"
server_status=$?
if ((server_status != 0)); then
  echo "hetmoe serve exited with status $server_status after SIGTERM:"
  cat "$log"
  exit 1
fi
grep -q "hetmoe: stopped" "$log" || { echo "no orderly stop in the server's log"; cat "$log"; exit 1; }
exit $status
