# Sourced by the evidence scripts. `claim DIR` succeeds when DIR's run should start: it has no
# summary.json and no live run holds its lock; a partial run left there is wiped first.
claim() {
  local dir=$1
  [ -f "$dir/summary.json" ] && return 1
  if [ -e "$dir/.lock" ] && ! flock -n "$dir/.lock" true; then
    echo "skipping $dir: a run holds it" >&2; return 1  # never wipe a run in progress
  fi
  rm -rf "$dir"
}
